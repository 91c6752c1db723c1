"""Write docs/variants.md: every registry entry with its paper, cost and capabilities.

    python scripts/gen_variants_doc.py            # rewrite docs/variants.md
    python scripts/gen_variants_doc.py --check    # exit 1 when the committed page differs

The capability columns are not written by hand. They come from the registry (``capabilities()``, each entry's
options and its ``position_kinds``) and from constructing a ``BackboneConfig`` with each setting, so they say
what the code accepts today. The padding column runs a tiny float64 backbone with and without masked padding
tokens. The paper, cost and notes columns are the ``META`` table at the end of this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from rl_transformers.backbone import Backbone, BackboneConfig, available, registry
from rl_transformers.utils.atomic import atomic_write_text
from rl_transformers.utils.tables import markdown_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "variants.md"
KIND_EXAMPLE = {"none": "none", "input": "sinusoidal", "qk": "rope", "bias": "alibi", "scores": "xl_relative"}
NEEDS = {("attention", "block_local_2d"): {"attention_options": {"image_shape": [4, 4]}}}


def accepts(**fields: object) -> bool:
    """True when BackboneConfig accepts these fields (position 'none' unless given)."""
    try:
        BackboneConfig(**{"position": "none", **fields})  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def directions(family: str, name: str) -> str:
    fields = {family: name, **NEEDS.get((family, name), {})}
    if family == "position":
        fields["position"] = name
    ok = [label for label, causal in (("causal", True), ("bidir", False)) if accepts(causal=causal, **fields)]
    return " + ".join(ok) if ok else "—"


def position_kinds(family: str, name: str) -> str:
    fields = {family: name, **NEEDS.get((family, name), {})}
    ok = [
        kind
        for kind, example in KIND_EXAMPLE.items()
        if any(accepts(**{**fields, "position": example, "causal": causal}) for causal in (True, False))
    ]
    return ", ".join(ok)


def padding(name: str) -> str:
    """Which masked padding leaves the real tokens' outputs unchanged (float64, 1 layer, position none)."""
    results = {}
    for side in ("right", "left"):
        ok = True
        for causal in (True, False):
            fields = {"attention": name, "causal": causal, **NEEDS.get(("attention", name), {})}
            if not accepts(**fields):
                continue
            torch.manual_seed(0)
            cfg = BackboneConfig(d_model=16, n_layers=1, n_heads=2, position="none", **fields)  # type: ignore[arg-type]
            bb = Backbone(cfg).double().eval()
            x, pad = torch.randn(1, 12, 16, dtype=torch.double), torch.randn(1, 4, 16, dtype=torch.double)
            real = torch.ones(1, 12, dtype=torch.bool)
            with torch.no_grad():
                y = bb(x).y
                if side == "right":
                    y_pad = bb(torch.cat([x, pad], 1), key_padding_mask=torch.cat([real, ~real[:, :4]], 1)).y[
                        :, :12
                    ]
                else:
                    y_pad = bb(torch.cat([pad, x], 1), key_padding_mask=torch.cat([~real[:, :4], real], 1)).y[
                        :, 4:
                    ]
            ok = ok and bool((y - y_pad).abs().max() < 1e-9)
        results[side] = ok
    if results["left"] and results["right"]:
        return "left + right"
    return "right only" if results["right"] else ("left only" if results["left"] else "no")


def meta(family: str, name: str) -> dict[str, str]:
    return META.get(family, {}).get(name, {"paper": "(add to META in scripts/gen_variants_doc.py)"})


def option_names(family: str, name: str) -> str:
    names = [f.name for f in dataclasses.fields(registry.get(family, name).options)]
    return ", ".join(f"`{n}`" for n in names) if names else "–"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    escaped = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    return [*markdown_table(header, escaped), ""]


def render() -> str:
    names = available()
    lines = [INTRO.strip(), ""]

    lines += ["## Attention (`attention=`)", ""]
    rows = []
    for name in sorted(
        names["attention"], key=lambda n: list(META["attention"]).index(n) if n in META["attention"] else 99
    ):
        caps, m = registry.capabilities("attention", name), meta("attention", name)
        exact = "exact" if caps.exact else f"approx{' (' + m['approx'] + ')' if 'approx' in m else ''}"
        rows.append([
            f"`{name}`", m["paper"], m.get("cost", ""), exact, directions("attention", name),
            caps.streaming + (f": {m['stream']}" if "stream" in m else ""), padding(name),
            position_kinds("attention", name), option_names("attention", name),
        ])  # fmt: skip
    header = [
        "name",
        "paper",
        "time / memory",
        "exact",
        "masking",
        "streaming",
        "padding",
        "positions",
        "options",
    ]
    lines += table(header, rows)

    lines += ["## Positional schemes (`position=`)", ""]
    rows = []
    for name in sorted(
        names["position"], key=lambda n: list(META["position"]).index(n) if n in META["position"] else 99
    ):
        cls, m = registry.get("position", name).cls, meta("position", name)
        kernel = accepts(attention="linear", position=name)
        memory = accepts(memory="xl", position=name)
        rows.append([
            f"`{name}`", m["paper"], f"`{cls.kind}`", "yes" if cls.shift_invariant else "no",
            directions("position", name), "yes" if kernel else "no", "yes" if memory else "no",
            m.get("notes", ""), option_names("position", name),
        ])  # fmt: skip
    header = [
        "name",
        "paper",
        "kind",
        "shift-invariant",
        "masking",
        "kernel attentions",
        "memory",
        "notes",
        "options",
    ]
    lines += table(header, rows)

    for family, title in (
        ("memory", "Memory (`memory=`)"),
        ("block", "Blocks (`block=`)"),
        ("depth", "Depth (`depth=`)"),
    ):
        lines += [f"## {title}", ""]
        rows = []
        for name in sorted(
            names[family], key=lambda n: list(META[family]).index(n) if n in META[family] else 99
        ):
            caps, m = registry.capabilities(family, name), meta(family, name)
            row = [f"`{name}`", m["paper"], m.get("notes", ""), directions(family, name), caps.streaming]
            if family == "memory":
                row.append(position_kinds("memory", name))
            row.append(option_names(family, name))
            rows.append(row)
        header = ["name", "paper", "what it does", "masking", "streaming"]
        header += ["positions"] if family == "memory" else []
        lines += table([*header, "options"], rows)

    lines += [OUTRO.strip(), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/variants.md is out of date")
    args = parser.parse_args()
    torch.set_num_threads(1)
    text = render()
    if args.check:
        current = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
        sys.exit(0 if current == text else 1)
    atomic_write_text(DOC, text)
    print(f"wrote {DOC}")


# -- hand-written columns: paper (author year, arXiv id), cost, notes. Order = order in the page. ---------------
INTRO = """
# Variants

<!-- Generated by `python scripts/gen_variants_doc.py` from the registry; edit that script, not this page.
     tests/test_docs.py fails when this page differs from what the script writes. -->

Every name below is a registry key of `BackboneConfig` (`attention=`, `position=`, `memory=`, `block=`,
`depth=`); the entry's options go in `<kind>_options` as a dict, checked against the options listed here
(`BackboneConfig.options(kind)` returns the typed instance). `available()` lists the names and
`capabilities(kind, name)` returns an entry's declared capabilities. The contracts behind the columns are in
[design.md](design.md).

How each column is produced:

- **exact** (declared): `exact` means the entry equals dense softmax attention under its own mask or bias. It is
  tested against the float64 `reference_attention`, with the mask built independently in the test.
  `approx` entries are tested against their error law, and the bracket names the setting where they become
  exact.
- **masking** (checked): whether `BackboneConfig` accepts `causal=True` (causal) and `causal=False`
  (bidirectional) with this entry.
- **streaming** (declared): `exact` means a chunked run that carries the returned state equals one full pass,
  one token at a time included. `window` means the state is a bounded window of past inputs, equal to the full
  run under that window's mask. `none` means the caller must recompute over its own context window.
- **padding** (measured): which `key_padding_mask` layout leaves the outputs of the real tokens unchanged, in
  float64, at 1e-9. `right only` entries lay out their pattern by absolute position (strided summaries,
  compressed blocks, Linformer's projections), so left padding shifts it. The Decision Transformer pads on
  the right by default.
- **positions** (checked): the positional-scheme kinds `BackboneConfig` accepts with this entry: none, input
  (added to the hidden states), qk (RoPE), bias (a logit bias), scores (the scheme computes the logits).

Shapes: B batch, T new tokens, S keys they see, L length, H heads, D head dim, d width; w window, b block.
"""

OUTRO = """
## Notes

- No banded or blocked attention materialises an L×L matrix. Queries are cut into blocks, each block gathers
  its own keys, and the pieces are merged exactly by log-sum-exp. Memory tests at L = 8192 check the largest
  tensor allocated.
- Positions are per-row counts of tokens since the last reset, carried in the state, so every scheme streams
  exactly. The relative schemes are shift-invariant (tested with offsets up to 10⁵). Any relative scheme
  composes with a window: `attention="full", attention_options={"max_cache": w}` or `attention="local"`.
- All blocks take `ffn_chunks` (the FFN runs over sequence chunks in turn). `BackboneConfig.activation` is relu
  or gelu. `BackboneConfig.ffn_dropout` sets the FFN hidden-layer dropout; None means it uses `dropout`.
- Aux losses are returned unweighted in `out.aux_losses`, and the trainers add them with weights:
  `routing_commitment`, `compressive_*`, `act_ponder`, `adaptive_span_l1`, `early_exit_classifier`.
- **Memory length vs training window.** Memories are stop-gradient. How far the model *sees* is `mem_len`
  (and `cmem_len`·rate, or `store_size`). How far *gradients* flow is the chunk length the trainer feeds: PPO's
  training window, or DT's context. A chunked `xl` run equals one pass under the banded mask "key j visible
  from query t iff seg_start(t) − M ≤ j ≤ t" (tested).
- Adding a variant: one file in `rl_transformers/backbone/<family>/` with a `@register(...)` class, one test
  file `tests/backbone/test_<family>.py`, and one entry in `META` of `scripts/gen_variants_doc.py`. Then
  regenerate this page. `tests/backbone/test_generic.py` picks the entry up from the registry and runs the
  invariants of [design.md](design.md#invariants-every-variant-is-tested-for).
"""

META: dict[str, dict[str, dict[str, str]]] = {
    "attention": {
        "full": {"paper": "Vaswani et al. 2017, arXiv 1706.03762 (SDPA / FlashAttention path when no bias)",
                 "cost": "O(T·S·D) / O(T·S)", "stream": "KV cache; `max_cache` = sliding window"},
        "local": {"paper": "sliding window; the length-extrapolation \"super-baseline\" (Su 2023)",
                  "cost": "O(L·w)", "stream": "cache of w keys"},
        "block_local": {"paper": "Parmar et al. 2018, arXiv 1802.05751 (1D blocks + flange)",
                        "cost": "O(L·(b + flange))", "stream": "bounded cache"},
        "block_local_2d": {"paper": "Parmar et al. 2018, arXiv 1802.05751 (2D blocks on an H×W raster)",
                           "cost": "O(L·(qh+fh)·(qw+fw))", "stream": "with `image_shape`"},
        "strided": {"paper": "Child et al. 2019, arXiv 1904.10509 (`combine` = union / alternate / split_heads)",
                    "cost": "O(L·l + L²/l)", "stream": "full cache"},
        "fixed": {"paper": "Child et al. 2019, arXiv 1904.10509 (c summary positions)",
                  "cost": "O(L·l + c·L²/l)", "stream": "full cache"},
        "blockwise": {"paper": "Qiu et al. 2019, arXiv 1911.02972 (BlockBERT, permutations per head)",
                      "cost": "O(L·n·b)", "stream": "bounded cache"},
        "longformer": {"paper": "Beltagy et al. 2020, arXiv 2004.05150 (window + dilation + global tokens)",
                       "cost": "O(L·(w·d + G))", "stream": "window + G global keys"},
        "bigbird": {"paper": "Zaheer et al. 2020, arXiv 2007.14062 (window + global + seeded random blocks)",
                    "cost": "O(L·b·(2w+1+r) + L·G)", "stream": "full cache"},
        "etc": {"paper": "Ainslie et al. 2020, arXiv 2004.08483 (g2g / g2l / l2g / l2l)",
                "cost": "O(L·(r + G))", "stream": "window + G global keys"},
        "lsh": {"paper": "Kitaev et al. 2020, arXiv 2001.04451 (Reformer; `reformer_config()` preset)",
                "cost": "O(R·L·m)", "approx": "= full shared-QK with one bucket", "stream": "cache of shared keys"},
        "routing": {"paper": "Roy et al. 2021, arXiv 2003.05997 (online k-means, `local_heads`)",
                    "cost": "O(L²/k) balanced", "approx": "= full with one cluster", "stream": "cache + cluster ids"},
        "linformer": {"paper": "Wang et al. 2020, arXiv 2006.04768 (E, F projections; 4 sharing modes)",
                      "cost": "O(L·k)", "approx": "= full with k = L, E = F = I"},
        "memory_compressed": {"paper": "Liu et al. 2018, arXiv 1801.10198 (strided-conv K/V compression)",
                              "cost": "O(L·(L/c + c))", "approx": "= full with c = 1"},
        "linear": {"paper": "Katharopoulos et al. 2020, arXiv 2006.16236 (elu+1; custom causal backward, eqs. 8-10)",
                   "cost": "O(L·C·D + L·D²) / O(D²) state", "approx": "kernel, not softmax", "stream": "state (S, z)"},
        "rfa": {"paper": "Peng et al. 2021, arXiv 2103.02143 (random Fourier features; optional RFA-Gate)",
                "cost": "O(L·m·D)", "stream": "state (S, z)"},
        "performer": {"paper": "Choromanski et al. 2021, arXiv 2009.14794 (FAVOR+, orthogonal, redraw)",
                      "cost": "O(L·m·D)", "stream": "state (S, z)"},
        "retnet": {"paper": "Sun et al. 2023, arXiv 2307.08621 (retention, γ_h = 1 - 2^(-5-h); swish gate, head norm)",
                   "cost": "O(L·C·D + L·D²) / O(D²) state", "approx": "recurrent, not softmax",
                   "stream": "state S; restarts cut by segment"},
        "gla": {"paper": "Yang et al. 2023, arXiv 2312.06635 (gated linear attention, low-rank key-dim decay)",
                "cost": "O(L·C·D + L·D²) / O(D²) state", "approx": "recurrent, not softmax",
                "stream": "state S; restarts cut by segment"},
        "mamba2": {"paper": "Dao & Gu 2024, arXiv 2405.21060 (SSD, scalar decay per head, short conv on x / B / C)",
                   "cost": "O(L·C·D + L·D²) / O(D²) state", "approx": "recurrent, not softmax",
                   "stream": "state S + conv window; restarts cut by segment"},
        "mlstm": {"paper": "Beck et al. 2024, arXiv 2405.04517 (xLSTM matrix memory, exp input gate, stabiliser)",
                  "cost": "O(L·C·D + L·D²) / O(D²) state", "approx": "recurrent, not softmax",
                  "stream": "state (C, n, m); restarts cut by segment"},
        "deltanet": {"paper": "Schlag et al. 2021, arXiv 2102.11174; chunkwise UT form: Yang et al. 2024, arXiv 2406.06484",
                     "cost": "O(L·C·D + L·D² + L·C²) / O(D²) state", "approx": "recurrent, not softmax",
                     "stream": "state S; restarts cut by segment"},
        "gated_deltanet": {"paper": "Yang et al. 2024, arXiv 2412.06464 (delta rule + scalar decay, SiLU output gate)",
                           "cost": "O(L·C·D + L·D² + L·C²) / O(D²) state", "approx": "recurrent, not softmax",
                           "stream": "state S; restarts cut by segment"},
        "gaussian_prior": {"paper": "Guo et al. 2019; Yang et al. 2018, arXiv 1810.10182 (locality prior, σ per head)",
                           "cost": "O(T·S·D)", "stream": "KV cache"},
        "adaptive_span": {"paper": "Sukhbaatar et al. 2019, arXiv 1905.07799 (soft ramp, L1 span penalty, dynamic span)",
                          "cost": "O(L·(z + R))", "stream": "cache of max_span + R keys"},
        "fox": {"paper": "Lin et al. 2025, arXiv 2503.02130 (forgetting attention: cumulative log forget-gate bias; optional sinks)",
                "cost": "O(T·S·D) / O(512·S)", "stream": "KV cache + log-gates since each key"},
        "lru": {"paper": "Orvieto et al. 2023, arXiv 2303.06349 (complex diagonal λ, γ normalisation, ring init)",
                "cost": "O(L·N·d) / O(N) state", "approx": "recurrent, not attention", "stream": "state h"},
        "mingru": {"paper": "Feng et al. 2024, arXiv 2410.01201 (minGRU, positive candidate g)",
                   "cost": "O(L·d·E) / O(E) state", "approx": "recurrent, not attention", "stream": "state h"},
        "mamba": {"paper": "Gu & Dao 2023, arXiv 2312.00752 (selective SSM, causal conv, SiLU gate)",
                  "cost": "O(L·E·(d + N)) / O(E·(N + K)) state", "approx": "recurrent, not attention",
                  "stream": "state (conv inputs, h)"},
        "ffm": {"paper": "Morad et al. 2023, arXiv 2310.04128 (fast and forgetful memory: decays α, frequencies ω)",
                "cost": "O(L·m·c·d) / O(m·c) state", "approx": "recurrent, not attention", "stream": "state S"},
    },
    "position": {
        "none": {"paper": "–", "notes": "order only through causal masking"},
        "sinusoidal": {"paper": "Vaswani et al. 2017, arXiv 1706.03762", "notes": "added before layer 0"},
        "learned": {"paper": "Gehring et al. 2017, arXiv 1705.03122; per layer: Al-Rfou et al. 2018, arXiv 1808.04444",
                    "notes": "one table, or one per layer"},
        "shaw": {"paper": "Shaw et al. 2018, arXiv 1803.02155", "notes": "clipped relative keys and values"},
        "xl_relative": {"paper": "Dai et al. 2019, arXiv 1901.02860",
                        "notes": "R, u, v, W_R; rel-shift (a gather when rows reset at different times)"},
        "t5": {"paper": "Raffel et al. 2020, arXiv 1910.10683", "notes": "bucketed, log-spaced beyond n_buckets/2"},
        "rope": {"paper": "Su et al. 2021, arXiv 2104.09864", "notes": "works with the kernel attentions too"},
        "xpos": {"paper": "Sun et al. 2022, arXiv 2212.10554",
                 "notes": "decay applied relative to the query block (no overflow on long streams)"},
        "alibi": {"paper": "Press et al. 2022, arXiv 2108.12409", "notes": "geometric slopes, non-power-of-2 rule"},
        "kerple_power": {"paper": "Chi et al. 2022, arXiv 2205.09921", "notes": "−r1·|i−j|^r2, r1 > 0, r2 ∈ (0, 2], learned"},
        "kerple_log": {"paper": "Chi et al. 2022, arXiv 2205.09921", "notes": "−r1·log(1 + r2·|i−j|), learned"},
        "sandwich": {"paper": "Chi et al. 2023, arXiv 2212.10356", "notes": "λ·p_m·p_n of sinusoids (a function of m − n)"},
        "da": {"paper": "Wu et al. 2021, arXiv 2010.06925 (DA-Transformer)",
               "notes": "ReLU(q·k) × learned sigmoid distance weight per head"},
    },
    "memory": {
        "xl": {"paper": "Dai et al. 2019, arXiv 1901.02860",
               "notes": "last `mem_len` attention inputs per layer, stop-gradient, on the K/V side"},
        "compressive": {"paper": "Rae et al. 2019, arXiv 1911.05507",
                        "notes": "FIFO `mem_len` + compressed `cmem_len` at rate c (max/mean pool, conv, dilated conv, "
                                 "most-used); auto-encoding + attention-reconstruction aux losses"},
        "knn": {"paper": "Wu et al. 2022, arXiv 2203.08913; SPALM gate: Yogatama et al. 2021, arXiv 2102.02557",
                "notes": "per-row FIFO store of normalised (k, v), exact top-k (or faiss), gated with local "
                         "attention at one layer"},
    },
    "block": {
        "post_ln": {"paper": "Vaswani et al. 2017, arXiv 1706.03762", "notes": "x = LN(x + F(x))"},
        "pre_ln": {"paper": "Xiong et al. 2020, arXiv 2002.04745", "notes": "x = x + F(LN(x)), final LN"},
        "gtrxl": {"paper": "Parisotto et al. 2019, arXiv 1910.06764",
                  "notes": "identity-map reordering + GRU gates, `gate_bias` b_g = 2.0"},
        "rezero": {"paper": "Bachlechner et al. 2020, arXiv 2003.04887", "notes": "x = x + α·F(x), α = 0 at init"},
        "reversible": {"paper": "Gomez et al. 2017, arXiv 1707.04585; Kitaev et al. 2020, arXiv 2001.04451",
                       "notes": "two streams, activations recomputed in backward (saved memory constant in depth)"},
    },
    "depth": {
        "fixed": {"paper": "–", "notes": "n_layers distinct blocks"},
        "universal": {"paper": "Dehghani et al. 2019, arXiv 1807.03819; ACT: Graves 2016, arXiv 1603.08983",
                      "notes": "one shared block up to n_layers times, per-position halting, ponder cost `act_ponder`"},
        "early_exit": {"paper": "Elbayad et al. 2020, arXiv 1910.10073; CALM: Schuster et al. 2022, arXiv 2207.07061",
                       "notes": "per-token exit by saturation / softmax response / learned classifier; exited "
                                "states copied upward"},
    },
}  # fmt: skip


if __name__ == "__main__":
    main()
