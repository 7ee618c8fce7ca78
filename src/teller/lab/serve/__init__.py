"""The lab's serving workload: a small Llama served with continuous batching and tensor parallelism.

`teller lab serve` runs it standalone; `teller lab run` runs it under the collector with one fault
injected. The forward pass is Hugging Face transformers' `LlamaForCausalLM` sharded by its own
`tp_plan`, so traces hold the operator sequences a real third-party model produces; the batching
loop (waiting queue, running batch, prefill/decode/mixed steps) is ours, shaped like vLLM V1's.
"""

from teller.lab.serve.config import ServeConfig

__all__ = ["ServeConfig"]
