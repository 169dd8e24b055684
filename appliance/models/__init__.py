"""The local models: the catalogue of HF directories and GGUF files, their size and fit before loading."""
