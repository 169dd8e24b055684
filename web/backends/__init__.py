"""Backends: whatever generates for the gateway behind one small protocol (web/backends/protocol.py): the
embedded engine's client, or OpenAI-compatible servers on the LAN (vLLM, SGLang, llama.cpp, another appliance).
The router picks one per request; keys, quotas and history never depend on which."""
