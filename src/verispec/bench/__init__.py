"""`verispec bench`: verispec's methods beside plain decoding and HF transformers' own
generation, measured the same way on the same model (see `suite` for the outputs and
`protocol` for the measurement rules)."""
