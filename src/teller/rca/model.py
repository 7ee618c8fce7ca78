"""The multimodal root-cause model: one small transformer encoder, three heads (nanoGPT-like).

One example is one step of one case, all ranks. Its inputs are three modalities laid out as one
sequence of at most ``1 + 1 + max_trace_tokens + max_log_lines`` positions:

* a summary position (``[CLS]``) whose output the step and explanation heads read;
* the step's numeric features (`teller.rca.inputs.STEP`: batch composition, step time against
  its expected time, per-rank GPU/host/comm work, the previous and next steps' times, the run's
  shape, and how the slowest rank's kernels are slower than its peers'), projected to one
  position;
* the step's slice as TPE tokens: for each of the localizer's top candidate nodes (every step
  has them, not only the steps the localizer flags), the tokens of its ancestor path (the
  candidate's own node is in the last one, its *focus* token), each with its vocabulary id,
  layer, rank, candidate kind, role and a few numbers (log-duration, depth, observed/normal,
  excess, z). Rank ids only say which tokens share a rank: training renames them at random
  (`teller.rca.train.relabel_ranks`), so no rank number is learned as guilty;
* the aligned log lines: template ids hashed into a small vocabulary plus a few numbers
  (`LOG`), and the request queue at the step (`QUEUE`) in a template slot of its own.

Heads, trained jointly with ``L = λ_step·L_step + λ_op·L_op + λ_explain·L_explain``:

* **step**: is this step anomalous (binary, from ``[CLS]``);
* **pointer**: a score per token, masked to focus tokens, so it can only ever pick a candidate
  node; the pointed token resolves to that node's operator and rank;
* **explain**: the fault type, read from ``[CLS]`` and the pointed token together (at inference
  the flagged steps of a run pool their votes), and the mechanism the explanation states, one of
  the sentence plans `teller.rca.plans.MECHANISMS` (a late arrival with its peers waiting, host
  operators stretched, kernels slower, a GPU idle for launches, a slower transfer, recomputed
  prefills, small batches, or none), read from the same two and the fault type. The explanation
  is then composed from sentence plans whose slots take the pointed node's measured facts only
  (`teller.rca.explain`), so no sentence can be ill-formed or name an operator or rank the
  pointer did not pick. L_explain is the fault type's cross-entropy plus the mechanism's, both on
  anomalous steps only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from teller.ingest.schema import LAYERS
from teller.rca.inputs import (
    CANDIDATE_KINDS,
    FAULT_NAMES,
    LOG,
    ROLE_FOCUS,
    STEP,
    TOKEN,
    Batch,
)
from teller.rca.plans import MECHANISMS

MAX_RANKS = 64


@dataclass
class ModelConfig:
    """Sizes and switches of one model; saved as JSON beside its weights."""

    vocab_size: int = 512  # TPE vocabulary (token kind ids at or above it share the last id)
    log_vocab: int = 64  # hashed log-template buckets (+1 for padding)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    dropout: float = 0.0
    use_logs: bool = True
    use_numeric: bool = True
    lambda_step: float = 1.0
    lambda_op: float = 1.0
    lambda_explain: float = 1.0
    pos_weight: float = 4.0  # anomalous steps are rare: weight them up in L_step
    mechanisms: int = len(MECHANISMS)  # the explanation head's sentence plans

    def to_json(self) -> dict:
        return asdict(self)


class Block(nn.Module):
    """Pre-norm transformer block: self-attention with a padding mask, then an MLP."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )
        self.n_heads = config.n_heads
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor, keep: torch.Tensor, causal: bool = False) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=2)
        shape = (batch, length, self.n_heads, width // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        mask = keep[:, None, None, :]  # attend to real positions only
        if causal:  # and, in the decoder, to earlier ones
            mask = mask & torch.ones(length, length, dtype=torch.bool).tril()
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(y.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.ln_2(x))


class RootCauseModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.modality = nn.Embedding(4, d)  # cls, numeric, trace, log
        self.step_in = nn.Linear(STEP.width, d)
        self.kind = nn.Embedding(config.vocab_size + 1, d)
        self.layer = nn.Embedding(len(LAYERS), d)
        self.rank = nn.Embedding(MAX_RANKS, d)
        self.cand_kind = nn.Embedding(len(CANDIDATE_KINDS), d)
        self.role = nn.Embedding(3, d)
        self.token_in = nn.Linear(TOKEN.width, d)
        # hashed templates 1..log_vocab, then the request queue's own slot
        self.template = nn.Embedding(config.log_vocab + 2, d, padding_idx=0)
        self.log_in = nn.Linear(LOG.width, d)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.step_head = nn.Linear(d, 1)
        self.pointer_head = nn.Linear(d, 1)
        self.explain_head = nn.Sequential(
            nn.Linear(2 * d, d), nn.GELU(), nn.Linear(d, len(FAULT_NAMES))
        )
        self.fault_in = nn.Embedding(len(FAULT_NAMES), d)
        self.condition = nn.Linear(2 * d, d)
        self.mechanism_head = nn.Linear(d, config.mechanisms)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, batch: Batch[torch.Tensor], pointed: torch.Tensor | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """Outputs (step logit, pointer logits, fault logits), and the losses when labels are given.

        `pointed` picks the token the explanation head reads; by default the labelled one where
        there is a label (teacher forcing), else the pointer's own choice.
        """
        c = self.config
        size = batch.step_float.shape[0]
        tokens = batch.tok_kind.clamp(max=c.vocab_size)
        trace = (
            self.kind(tokens)
            + self.layer(batch.tok_layer)
            + self.rank(batch.tok_rank.clamp(0, MAX_RANKS - 1))
            + self.cand_kind(batch.tok_ckind)
            + self.role(batch.tok_role)
            + self.token_in(batch.tok_float)
            + self.modality.weight[2]
        )
        trace_keep = batch.tok_role > 0
        step = (self.step_in(batch.step_float) + self.modality.weight[1])[:, None]
        step_keep = torch.full((size, 1), c.use_numeric, dtype=torch.bool)
        logs = (
            self.template(batch.log_template)
            + self.log_in(batch.log_float)
            + self.modality.weight[3]
        )
        log_keep = (batch.log_template > 0) & c.use_logs
        cls = (self.cls + self.modality.weight[0]).expand(size, 1, -1)
        x = torch.cat([cls, step, trace, logs], dim=1)
        keep = torch.cat([torch.ones_like(step_keep), step_keep, trace_keep, log_keep], dim=1)
        for block in self.blocks:
            x = block(x, keep)
        x = self.ln_f(x)
        summary = x[:, 0]
        trace_out = x[:, 2 : 2 + trace.shape[1]]
        step_logit = self.step_head(summary).squeeze(-1)
        focus = batch.tok_role == ROLE_FOCUS
        pointer = self.pointer_head(trace_out).squeeze(-1).masked_fill(~focus, -1e9)
        if pointed is None:
            pointed = batch.y_ptr
            if pointed is None:
                pointed = torch.full((size,), -1, dtype=torch.long)
            pointed = torch.where(pointed >= 0, pointed, pointer.argmax(-1))
        outputs = {"step_logit": step_logit, "pointer": pointer, "summary": summary}
        outputs["trace_out"], outputs["has_focus"] = trace_out, focus.any(-1, keepdim=True)
        outputs.update(self.read_pointed(outputs, pointed))
        if batch.y_fault is not None:  # teacher forcing: the labelled node and fault type
            outputs["mechanism_logits"] = self.mechanism_logits(
                summary, outputs["chosen"], batch.y_fault
            )
        if batch.y_step is None:
            return outputs, None
        return outputs, self.losses(outputs, batch)

    def read_pointed(
        self, outputs: dict[str, torch.Tensor], pointed: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The pointed token's output (`chosen`, what the decoder reads) and the fault logits
        read from it with the summary. Separate from `forward` so an ensemble can re-read the
        node its members agreed on without encoding the batch again."""
        trace_out = outputs["trace_out"]
        chosen = trace_out[torch.arange(trace_out.shape[0]), pointed.clamp(min=0)]
        chosen = chosen * outputs["has_focus"]  # no candidate: nothing to read
        fault_logits = self.explain_head(torch.cat([outputs["summary"], chosen], dim=-1))
        return {"chosen": chosen, "fault_logits": fault_logits}

    def losses(
        self, outputs: dict[str, torch.Tensor], batch: Batch[torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        c = self.config
        step_loss = F.binary_cross_entropy_with_logits(
            outputs["step_logit"],
            batch.y_step,
            pos_weight=torch.tensor(c.pos_weight),
        )
        has_target = batch.y_ptr >= 0
        op_loss = (
            F.cross_entropy(outputs["pointer"][has_target], batch.y_ptr[has_target])
            if has_target.any()
            else outputs["pointer"].sum() * 0.0
        )
        # the fault type only matters on anomalous steps (the step head tells faults from none):
        # fitting it on every step would spend the head on the many normal ones
        faulty = batch.y_step > 0
        explain_loss = (
            F.cross_entropy(outputs["fault_logits"][faulty], batch.y_fault[faulty])
            if faulty.any()
            else outputs["fault_logits"].sum() * 0.0
        )
        stated = faulty & (batch.y_mechanism >= 0)  # the mechanism (anomalous steps)
        if "mechanism_logits" in outputs and stated.any():
            explain_loss = explain_loss + F.cross_entropy(
                outputs["mechanism_logits"][stated], batch.y_mechanism[stated]
            )
        total = c.lambda_step * step_loss + c.lambda_op * op_loss + c.lambda_explain * explain_loss
        return {"total": total, "step": step_loss, "op": op_loss, "explain": explain_loss}

    # -- the explanation head's mechanism ----------------------------------------------------
    def mechanism_logits(
        self, summary: torch.Tensor, chosen: torch.Tensor, fault: torch.Tensor
    ) -> torch.Tensor:
        """One logit per `MECHANISMS`, read from the summary and the pointed token given the
        fault type (the labelled one in training, the run's pooled one at inference)."""
        condition = self.condition(torch.cat([summary, chosen], dim=-1)) + self.fault_in(fault)
        return self.mechanism_head(F.gelu(condition))
