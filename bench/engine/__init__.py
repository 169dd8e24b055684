"""The side-by-side benchmark: one seeded workload against each batching policy and transformers' own CB."""
