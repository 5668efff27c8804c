"""How weights are held: GGUF blocks as stored, the one reader of a transformers Llama/Qwen2
checkpoint, and the projections of every weight format. A format knows no runtime and no
loader."""
