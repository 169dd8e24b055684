"""What only a CPU runs: the CPU plan, the kernels compiled at start and their build, compact and prepacked
weights, the allocator tuning and the machine's flags."""
