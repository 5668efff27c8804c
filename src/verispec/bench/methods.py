"""Method names on the `--methods` line, parsed into what to run.

Grammar (names are comma-separated):

    verispec-plain                      plain decoding by the verispec engine (the baseline)
    verispec-plain@FORMAT               plain decoding of the same model loaded in another weight
                                        format (q4, bfloat16, float32, float16), as --dtype FORMAT
                                        loads it: another target, compared as a peer; the report's
                                        speedup over the fastest plain format weighs it (the bench
                                        adds one for each other format --dtype auto weighs)
    verispec-<proposer>-<policy>        <proposer>: a proposer spec of `verispec.registry`
                                        (`verispec proposers` lists them); <policy>: kN
                                        (constant k = N), auto (cost-model k), heuristic
                                        (HF's schedule), tree (cost-model token tree, e.g.
                                        verispec-lookup-tree) or tree:W1xW2x... (a constant
                                        tree); trees need a proposer that fills them
    verispec-oracle:ALPHA-<policy>      a measuring tool, not a proposer: drafts the target's own
                                        plain greedy continuation (decoded first, untimed), each
                                        drafted token right with probability ALPHA
                                        (`proposers.controlled`), greedy only; what a proposer
                                        of acceptance ALPHA would gain here, beside `verispec cost`
    hf-generate                         HF `generate(do_sample=False)`
    hf-lookup[-kN]                      HF prompt lookup, prompt_lookup_num_tokens = N (10)
    hf-early-exit:L[-kN]                HF `assistant_early_exit=L`; kN fixes the draft length
    hf-assisted[:PATH][-kN]             HF `assistant_model=PATH` (bare: the one draft PATH of
                                        the verispec-draft:PATH methods)
    llamacpp-plain                      llama.cpp's greedy decoding of the target's GGUF file (a
                                        peer: its arithmetic differs, see peers.llamacpp)
    llamacpp-lookup[-kN]                llama-cpp-python's prompt lookup, num_pred_tokens = N (10)
    llamacpp-...@q8_0                   either, on a Q8_0 value cache (`--cache-type-v q8_0`'s
                                        target; without it llama.cpp's default float16 cache)
    vllm-plain                          vLLM's CPU build in its own venv, greedy (a peer, `peers.vllm`)
    vllm-ngram[-kN]                     vLLM's ngram speculation (prompt lookup, n-grams of 2 to 4),
                                        N drafts (4)
    vllm-eagle3:DIR[-kN]                an EAGLE-3 head in speculators' format (`verispec export-head
                                        --format speculators`), N drafts (3)
    vllm-medusa:DIR                     a Medusa head in vLLM's format (`--format vllm-medusa`), its
                                        K drafts
    vllm-config:FILE[-kN]               the `speculative_config` of FILE, written by `verispec profile
                                        --vllm-config` (its k per batch size); -kN: the same drafter
                                        at a fixed N, the schedule dropped, to compare the two

The policy is split off at the LAST '-', so a draft PATH may itself contain '-'.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from verispec.peers.llamacpp import LOOKUP_TOKENS as LLAMACPP_LOOKUP_TOKENS
from verispec.models.weight_format import TARGET
from verispec.registry import KSpec, ProposerSpec, check_k, check_policy_proposer, parse_k, parse_spec

DEFAULT_METHODS = "verispec-plain,verispec-lookup-k4,verispec-lookup-auto,hf-generate,hf-lookup"

PLAIN = "verispec-plain"


def plain_in(fmt: str) -> str:
    """The method that decodes plainly in weight format `fmt`."""
    return f"{PLAIN}@{fmt}"


def is_plain(name: str) -> bool:
    """verispec-plain, in the bench's format or another (`verispec-plain@FORMAT`)."""
    return name == PLAIN or name.startswith(f"{PLAIN}@")
HF_LOOKUP_TOKENS = 10  # HF's documented prompt_lookup_num_tokens example value
VLLM_NGRAM_TOKENS = 4
VLLM_EAGLE3_TOKENS = 3
VLLM_GRAMMAR = "vllm-plain, vllm-ngram[-kN], vllm-eagle3:DIR[-kN], vllm-medusa:DIR or vllm-config:FILE[-kN]"
POLICIES = ("auto", "heuristic", "tree")
POLICY_GRAMMAR = "kN, auto, heuristic, tree or tree:W1xW2x..."
_K = re.compile(r"k(\d+)")
ORACLE = "oracle:"  # verispec-oracle:ALPHA-<policy>, the controlled-acceptance measuring tool


@dataclass(frozen=True)
class Method:
    """One benchmarked method.

    family: "verispec", "hf", "llamacpp" or "vllm". proposer: the verispec proposer spec, "lookup"
    for llamacpp-lookup, or vLLM's method ("ngram", "eagle3:DIR", "medusa:DIR") (None: plain decoding).
    policy: "kN", "auto", "heuristic", "tree" or "tree:W1xW2x..." for verispec; None for HF. hf_mode: "generate",
    "lookup", "early-exit" or "assisted". hf_arg: the exit layer or the assistant's path.
    k: the fixed draft length (verispec kN, HF -kN), None when a policy or HF's default
    chooses it. oracle: the acceptance of a `verispec-oracle:ALPHA` method (its proposer is
    no registry spec), else None. dtype: the weight format of a `verispec-plain@FORMAT` method
    (None: the bench's own target). cache_type_v: the value cache of a `llamacpp-*` method
    ("f16", llama.cpp's default, or "q8_0" for `llamacpp-...@q8_0`).
    """

    name: str
    family: str
    proposer: str | None = None
    policy: str | None = None
    hf_mode: str | None = None
    hf_arg: str | None = None
    k: int | None = None
    oracle: float | None = None
    dtype: str | None = None
    cache_type_v: str = "f16"
    # read once from proposer, k and policy when the method is made (verispec methods only)
    proposer_spec: ProposerSpec | None = field(init=False, default=None, repr=False, compare=False)
    k_spec: KSpec | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.family != "verispec" or self.proposer is None:
            return
        object.__setattr__(self, "k_spec", parse_k(self.k if self.k is not None else self.policy, option="the policy"))
        if self.oracle is None:
            object.__setattr__(self, "proposer_spec", parse_spec(self.proposer))

    @property
    def speculative(self) -> bool:
        return self.proposer is not None or self.hf_mode not in (None, "generate")


def split_k(text: str) -> tuple[str, int | None]:
    """'spec-k4' -> ('spec', 4); 'spec' -> ('spec', None)."""
    head, dash, tail = text.rpartition("-")
    match = _K.fullmatch(tail) if dash else None
    if match is None:
        return text, None
    return head, method_k(int(match.group(1)), text)


def method_k(k: int, name: str) -> int:
    return check_k(k, name=f"method {name!r}: k")


def parse_method(name: str) -> Method:
    name = name.strip()
    if name == PLAIN:
        return Method(name, "verispec")
    if name.startswith(f"{PLAIN}@"):
        fmt = name.removeprefix(f"{PLAIN}@")
        if fmt not in TARGET:
            raise ValueError(f"method {name!r}: the format {fmt!r} is not {', '.join(TARGET)}")
        return Method(name, "verispec", dtype=fmt)
    if name.startswith("verispec-"):
        proposer, dash, policy = name.removeprefix("verispec-").rpartition("-")
        if not dash or not proposer:
            raise ValueError(
                f"method {name!r}: write verispec-<proposer>-<kN|auto|heuristic|tree|tree:W1xW2x...>, "
                "e.g. verispec-lookup-k4"
            )
        match = _K.fullmatch(policy)
        if match is None and policy not in POLICIES and not policy.startswith("tree:"):
            raise ValueError(f"method {name!r}: the policy {policy!r} is not {POLICY_GRAMMAR}")
        k = method_k(int(match.group(1)), name) if match else None
        if proposer.startswith(ORACLE):
            return oracle_method(name, proposer, policy, k)
        try:
            method = Method(name, "verispec", proposer=proposer, policy=policy, k=k)
        except ValueError as error:
            raise ValueError(f"method {name!r}: {error}") from None
        if method.k_spec.profile is not None:  # a profile path is no part of a method name
            raise ValueError(f"method {name!r}: the policy {policy!r} is not {POLICY_GRAMMAR}")
        try:
            check_policy_proposer(method.k_spec, method.proposer_spec, option="the policy")
        except ValueError as error:
            raise ValueError(f"method {name!r}: {error}") from None
        return method
    if name == "hf-generate":
        return Method(name, "hf", hf_mode="generate")
    if name.startswith("hf-lookup"):
        head, k = split_k(name)
        if head != "hf-lookup":
            raise ValueError(f"method {name!r}: write hf-lookup or hf-lookup-kN")
        return Method(name, "hf", hf_mode="lookup", k=k or HF_LOOKUP_TOKENS)
    if name.startswith("hf-early-exit"):
        head, k = split_k(name)
        layer = head.removeprefix("hf-early-exit:")
        if not head.startswith("hf-early-exit:") or not layer.isdigit() or int(layer) < 1:
            raise ValueError(f"method {name!r}: write hf-early-exit:L or hf-early-exit:L-kN with a layer L >= 1")
        return Method(name, "hf", hf_mode="early-exit", hf_arg=layer, k=k)
    if name == "hf-assisted" or name.startswith(("hf-assisted:", "hf-assisted-")):
        head, k = split_k(name)
        path = head.removeprefix("hf-assisted").removeprefix(":")
        if head != "hf-assisted" and not head.startswith("hf-assisted:"):
            raise ValueError(f"method {name!r}: write hf-assisted[:PATH][-kN]")
        return Method(name, "hf", hf_mode="assisted", hf_arg=path or None, k=k)
    if name.startswith(("llamacpp-plain", "llamacpp-lookup")):
        return llamacpp_method(name)
    if name.startswith("vllm-"):
        return vllm_method(name)
    raise ValueError(
        f"unknown method {name!r}; choose verispec-plain, verispec-<proposer>-<kN|auto|heuristic|tree>, "
        f"hf-generate, hf-lookup[-kN], hf-early-exit:L[-kN], hf-assisted[:PATH][-kN], llamacpp-plain[@q8_0], "
        f"llamacpp-lookup[-kN][@q8_0], {VLLM_GRAMMAR}"
    )


def llamacpp_method(name: str) -> Method:
    """A `llamacpp-*` method name -> Method(family "llamacpp", proposer None or "lookup", k,
    cache_type_v from an `@q8_0` suffix)."""
    base, at, cache = name.partition("@")
    if at and cache != "q8_0":
        raise ValueError(f"method {name!r}: the value cache {cache!r} is not q8_0 (without @, llama.cpp's float16)")
    cache_type_v = cache or "f16"
    if base == "llamacpp-plain":
        return Method(name, "llamacpp", cache_type_v=cache_type_v)
    head, k = split_k(base)
    if head != "llamacpp-lookup":
        raise ValueError(f"method {name!r}: write llamacpp-plain, llamacpp-lookup or llamacpp-lookup-kN, each with @q8_0 or not")
    return Method(name, "llamacpp", proposer="lookup", k=k or LLAMACPP_LOOKUP_TOKENS, cache_type_v=cache_type_v)


def vllm_method(name: str) -> Method:
    """A `vllm-*` method name -> Method(family "vllm", proposer None, "ngram", "eagle3:DIR",
    "medusa:DIR" or "config:FILE", k; for config:FILE, None keeps the file's schedule).

    >>> vllm_method("vllm-ngram-k3").proposer, vllm_method("vllm-ngram-k3").k
    ('ngram', 3)
    >>> vllm_method("vllm-eagle3:heads/e3").k
    3
    """
    if name == "vllm-plain":
        return Method(name, "vllm")
    head, k = split_k(name)
    if head == "vllm-ngram":
        return Method(name, "vllm", proposer="ngram", k=k or VLLM_NGRAM_TOKENS)
    kind, _, directory = head.removeprefix("vllm-").partition(":")
    if kind == "config" and directory:
        return Method(name, "vllm", proposer=f"config:{directory}", k=k)
    if kind in ("eagle3", "medusa") and directory:
        if kind == "medusa" and k is not None:
            raise ValueError(f"method {name!r}: a Medusa head drafts its own K tokens; write vllm-medusa:DIR")
        return Method(name, "vllm", proposer=f"{kind}:{directory}", k=k or (VLLM_EAGLE3_TOKENS if kind == "eagle3" else None))
    raise ValueError(f"method {name!r}: write {VLLM_GRAMMAR}")


def oracle_method(name: str, proposer: str, policy: str, k: int | None) -> Method:
    """verispec-oracle:ALPHA-<policy>, ALPHA a number in [0, 1]."""
    text = proposer.removeprefix(ORACLE)
    try:
        alpha = float(text)
    except ValueError:
        alpha = math.nan
    if not 0 <= alpha <= 1:
        raise ValueError(f"method {name!r}: write verispec-oracle:ALPHA-<policy> with an acceptance ALPHA in [0, 1], e.g. verispec-oracle:0.8-k4")
    try:
        return Method(name, "verispec", proposer=proposer, policy=policy, k=k, oracle=alpha)
    except ValueError as error:
        raise ValueError(f"method {name!r}: {error}") from None


def parse_methods(text: str | Sequence[str]) -> list[Method]:
    """Comma-separated names (or several such strings) -> methods, verispec-plain first.

    verispec-plain is the baseline every speedup divides by, so it is added when missing. A
    bare hf-assisted takes the draft path of the verispec-draft methods when there is exactly
    one.
    """
    items = [text] if isinstance(text, str) else list(text)
    names = [n.strip() for item in items for n in item.split(",") if n.strip()]
    if not names:
        raise ValueError("no methods given; e.g. --methods verispec-plain,verispec-lookup-k4,hf-generate")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"methods listed twice: {duplicates}")
    methods = [parse_method(n) for n in names]
    if PLAIN not in names:
        methods.insert(0, parse_method(PLAIN))
    drafts = sorted({m.proposer.removeprefix("draft:") for m in methods if (m.proposer or "").startswith("draft:")})
    resolved = []
    for method in methods:
        if method.hf_mode == "assisted" and method.hf_arg is None:
            if len(drafts) != 1:
                raise ValueError(
                    f"method {method.name!r} needs a draft model: write hf-assisted:PATH "
                    f"(the verispec-draft methods name {len(drafts)} draft paths)"
                )
            method = Method(method.name, "hf", hf_mode="assisted", hf_arg=drafts[0], k=method.k)
        resolved.append(method)
    resolved.sort(key=lambda m: m.name != PLAIN)
    return resolved
