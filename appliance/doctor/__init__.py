"""`appliance doctor`: the machine, the model, the database, the backends and vLLM, each finding in one line."""
