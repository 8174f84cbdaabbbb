"""A small GPT-style character language model trained with DDP under torchrelay.

Run it like a torchrun script, with one word changed (from a checkout, ``examples/train_gpt.py``
runs this file; ``torchrelay demo`` runs it from wherever torchrelay is installed):

    torchrelay run --nproc-per-node 4 --spares 1 examples/train_gpt.py --steps 200

The text is generated here from a fixed seed (nothing is downloaded). The torchrelay-specific
lines are marked with ``# relay``.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

import torchrelay

SUBJECTS = [
    "the engineer",
    "a spare gpu",
    "the controller",
    "every worker",
    "the old node",
    "a data parallel replica",
    "the optimizer",
    "our cluster",
]
VERBS = ["restores", "streams", "checks", "fences", "rebuilds", "commits", "replays", "trusts"]
OBJECTS = [
    "the weights",
    "each step",
    "the lost rank",
    "its gradients",
    "a fresh group",
    "the schedule",
    "the random state",
    "the final loss",
]
ENDINGS = [" quickly.", " without rollback.", " at the next step.", " once.", " again.", "."]


def make_text(num_sentences: int, seed: int = 0) -> str:
    """Deterministic synthetic English-like text: same seed, same text, on every rank."""
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}"
        for _ in range(num_sentences)
    )


class CharWindows(Dataset):
    """Every window of ``block + 1`` characters: input is the first ``block``, target the last."""

    def __init__(self, text: str, block: int) -> None:
        self.vocab = sorted(set(text))
        self.ids = torch.tensor([self.vocab.index(c) for c in text], dtype=torch.long)
        self.block = block

    def __len__(self) -> int:
        return len(self.ids) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.ids[i : i + self.block + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self,
        vocab: int,
        block: int,
        dim: int = 160,
        layers: int = 4,
        heads: int = 5,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(dim, heads, dropout) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.drop(self.tok(idx) + self.pos(pos)))
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def warmup_cosine(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--block", type=int, default=64, help="context length")
    parser.add_argument("--dim", type=int, default=160, help="model width")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--out", default=None, help="rank 0 saves the final weights here")
    args = parser.parse_args()

    relay = torchrelay.init(seed=1234)  # relay
    data = CharWindows(make_text(4000), args.block)
    net = GPT(len(data.vocab), args.block, args.dim, args.layers, args.heads)
    net = net.to(relay.device)  # relay: its GPU, or the CPU
    model = DDP(net, process_group=relay.process_group)  # relay
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(args.steps // 10, args.steps))
    relay.track(model=model, optimizer=opt, scheduler=sched)  # relay
    if relay.rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"GPT with {params / 1e6:.2f} M parameters, {len(data)} windows", flush=True)

    logged: tuple[int, float] | None = None  # the last logged step and when it was logged
    for step, (x, y) in relay.steps(
        data, batch_size=args.batch_size, max_steps=args.steps
    ):  # relay
        loss = model(x.to(relay.device), y.to(relay.device))
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        if relay.rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            now = time.perf_counter()
            pace = ""
            if logged and step > logged[0]:  # a recomputed step is logged twice
                pace = f"  {(now - logged[1]) / (step - logged[0]) * 1e3:.1f} ms/step"
            print(
                f"step {step:4d}  loss {loss.item():.4f}  lr {sched.get_last_lr()[0]:.2e}{pace}",
                flush=True,
            )
            logged = (step, now)

    if relay.rank == 0 and args.out:
        torch.save({k: v.cpu() for k, v in net.state_dict().items()}, args.out)


if __name__ == "__main__":
    main()
