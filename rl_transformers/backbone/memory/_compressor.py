"""The compression functions f_c of the ``compressive`` memory (Rae et al. 2019, arXiv 1911.05507) and their
decoder g: pooling, a strided convolution, a dilated convolution stack, or "most used" selection (see the memory's
module docstring)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _set(conv: nn.Conv1d | nn.ConvTranspose1d, weight: Tensor) -> None:
    """Initialise a convolution to ``weight`` and a zero bias."""
    with torch.no_grad():
        conv.weight.copy_(weight)
        if conv.bias is not None:
            conv.bias.zero_()


class Compressor(nn.Module):
    """One layer's compression f_c: (B, n, d) -> (B, n/c, d), and the decoder g: (B, n/c, d) -> (B, n, d)."""

    def __init__(self, kind: str, d: int, rate: int) -> None:
        super().__init__()
        self.kind = kind
        self.rate = rate
        eye = torch.eye(d)
        if kind == "conv":
            self.conv = nn.Conv1d(d, d, rate, stride=rate)
            _set(self.conv, eye[:, :, None].expand(d, d, rate) / rate)  # start as mean pooling
        elif kind == "dilated_conv":
            depth = (rate - 1).bit_length()  # ⌈log2 c⌉ layers: receptive field 2^depth >= c
            self.dilations = tuple(2**i for i in range(depth))
            self.convs = nn.ModuleList()
            for dilation in self.dilations:
                conv = nn.Conv1d(d, d, 2, dilation=dilation)
                _set(conv, eye[:, :, None].expand(d, d, 2) / 2)  # each layer averages x[t] and x[t - δ]
                self.convs.append(conv)
        self.decoder = nn.ConvTranspose1d(d, d, rate, stride=rate)
        _set(self.decoder, eye[:, :, None].expand(d, d, rate))  # start by repeating each slot c times

    def forward(
        self, x: Tensor, valid: Tensor | None = None, usage: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (B, n, d), valid (B, n) bool, usage (B, n) (most_used) -> compressed (B, n/c, d), group valid (B, n/c).

        Invalid memories (padding, empty slots) are left out of pools and zeroed before convolutions; a group
        without a valid memory gives zeros and is marked invalid.
        """
        b, n, d = x.shape
        c = self.rate
        if n % c:
            raise ValueError(f"compressing {n} memories at rate {c}: n must be a multiple of c")
        g = n // c
        if valid is None:
            valid = torch.ones(b, n, dtype=torch.bool, device=x.device)
        groups, member = x.view(b, g, c, d), valid.view(b, g, c)
        group_valid = member.any(-1)
        if self.kind == "mean_pool":
            out = (groups * member[..., None]).sum(2) / member.sum(2, keepdim=True).clamp_min(1)
        elif self.kind == "max_pool":
            out = groups.masked_fill(~member[..., None], float("-inf")).amax(2)
            out = torch.where(group_valid[..., None], out, torch.zeros_like(out))
        elif self.kind == "conv":
            seq = (x * valid[..., None]).transpose(1, 2)  # (B, d, n)
            out = self.conv(seq).transpose(1, 2)
        elif self.kind == "dilated_conv":
            h = (groups * member[..., None]).reshape(b * g, c, d).transpose(1, 2)  # one group per row
            for conv, dilation in zip(self.convs, self.dilations):
                h = conv(F.pad(h, (dilation, 0)))  # causal padding keeps the group length c
            out = h[..., -1].reshape(b, g, d)
        else:  # most_used
            if usage is None:
                raise ValueError("most_used compression needs the attention usage of each memory")
            score = usage.view(b, g, c).masked_fill(~member, float("-inf"))
            pick = score.argmax(-1)  # (B, g)
            out = groups.gather(2, pick[..., None, None].expand(b, g, 1, d)).squeeze(2)
            out = torch.where(group_valid[..., None], out, torch.zeros_like(out))
        return out, group_valid

    def decode(self, z: Tensor) -> Tensor:
        """g: (B, n/c, d) -> (B, n, d)."""
        return self.decoder(z.transpose(1, 2)).transpose(1, 2)
