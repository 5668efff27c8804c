"""verispec's peers: other runtimes decoding the same target, behind the types every runner
returns, for the benchmark (`verispec.bench`) and the runtime check (`verispec.runtime_check`).

    outcome     what a run returns, timed one way: Outcome and its Clock (one request), Served
                (one request of a closed loop)
    hf          HF transformers' `generate` on the same model object: one request, plain or
                assisted (HFRunner), or a left-padded batch (HFBatchServer)
    llamacpp    llama-cpp-python decoding the target's GGUF file: one request, plain or with its
                prompt lookup (LlamaCppRunner), or continuous batching (LlamaCppBatchServer)
    vllm        vLLM's CPU build in its own venv, through a worker process (vllm_worker): one
                request (VllmRunner) or its continuous batching (VllmBatchServer)
"""
