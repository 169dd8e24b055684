"""APPLIANCE_ENGINE=vllm: the local vLLM server the appliance starts, supervises and reads."""
