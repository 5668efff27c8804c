"""What runs a model: verispec's fast CPU forward (`llama`), the static-shape forward for GPUs
(`static_llama`), llama.cpp itself (`llamacpp`) and transformers (`hf`), each behind the
`CausalLM` protocol of `models.base`, with the caches they keep. A runtime builds from a weight
format (`models.formats`) and never imports the loader (`models.loading`)."""
