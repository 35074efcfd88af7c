#!/usr/bin/env python3
"""expscale_select.py: choose the exponent-scaling shift k from gradient exponent histograms
(docs/design.md, paper Section 4.2 and eq. 16-17).

Input: the JSON that `train_sdc -exp_profile FILE` writes: {"k": k0, "projections": {name: [256 counts]}},
the counts of the bf16 exponent codes (0 and 255 excluded) of dL/dY sampled at every linear layer on
clean steps while the loss was scaled by 2^k0. The unscaled histogram H is the counts shifted down by k0.

For a candidate k, every code c of H becomes c + k. A 4-bit fault flips exponent bit j; when that bit is
0 the value is multiplied by 2^(2^j) (amplified), when it is 1 it is divided (attenuated). The risk is
    R_amp(k; H) = sum_{j in J} P_H(bit j of (c + k) == 0) * (2^(2^j) - 1)^2,   J = {0, ..., 7}
computed exactly (Python integers and fractions, then as float). K_safe: the k in [kmin, kmax] that keep
every shifted code finite (max code + k < 255) and normal (min code + k >= 1). k* = argmin R_amp over
K_safe (the smallest such k on ties). Hold rule: a held k is kept while R_amp(k_held) <= 1.25 R_amp(k*);
otherwise the tool says to re-profile and move to k*.

    python scripts/expscale_select.py PROFILE.json [--held K] [--kmin 0] [--kmax 64] [--per-projection] [--json]
"""
import argparse
import json
import sys
from fractions import Fraction

J = range(8)
WEIGHT = [(2 ** (2 ** j) - 1) ** 2 for j in J]


def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def r_amp_exact(hist, k):
    """R_amp(k; H) as an exact Fraction. hist: dict code -> count (unscaled codes)."""
    total = sum(hist.values())
    if total == 0:
        raise ValueError("empty histogram")
    num = 0
    for c, n in hist.items():
        s = c + k
        for j in J:
            if not (s >> j) & 1:
                num += n * WEIGHT[j]
    return Fraction(num, total)


def k_safe(hist, kmin, kmax):
    codes = [c for c, n in hist.items() if n]
    lo, hi = min(codes), max(codes)
    return [k for k in range(kmin, kmax + 1) if hi + k < 255 and lo + k >= 1]


def select(hist, kmin=0, kmax=64, held=None):
    ks = k_safe(hist, kmin, kmax)
    if not ks:
        raise ValueError(f"no safe k in [{kmin}, {kmax}]")
    risk = {k: r_amp_exact(hist, k) for k in ks}
    kstar = min(ks, key=lambda k: (risk[k], k))
    out = {"k_safe": [ks[0], ks[-1]], "k_star": kstar, "r_amp": {k: float(v) for k, v in risk.items()},
           "r_min": float(risk[kstar])}
    if held is not None:
        rh = r_amp_exact(hist, held) if held in risk else None
        out["held"] = held
        out["r_held"] = float(rh) if rh is not None else None
        out["hold"] = rh is not None and rh <= Fraction(5, 4) * risk[kstar]
        out["decision"] = (f"hold k={held}" if out["hold"] else
                           f"re-profile: R_amp({held}) > 1.25 x min (k*={kstar})" if rh is not None else
                           f"k={held} is not safe: move to k*={kstar}")
    return out


def load_profile(path):
    try:
        with open(path) as f:
            prof = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{path}: cannot read the profile: {e}")
    if "projections" not in prof or not isinstance(prof["projections"], dict):
        fail(f"{path}: not an exponent profile (no 'projections')")
    k0 = int(prof.get("k", 0))
    hists = {}
    for name, counts in prof["projections"].items():
        if len(counts) != 256:
            fail(f"{path}: projection {name}: {len(counts)} counts, expected 256")
        h = {}
        for code, n in enumerate(counts):
            if n:
                if code - k0 < 1:
                    fail(f"{path}: projection {name}: code {code} below the profiling shift k={k0}")
                h[code - k0] = h.get(code - k0, 0) + int(n)
        if h:
            hists[name] = h
    if not hists:
        fail(f"{path}: the profile has no samples")
    return k0, hists


def pooled(hists):
    h = {}
    for hh in hists.values():
        for c, n in hh.items():
            h[c] = h.get(c, 0) + n
    return h


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--held", type=int, default=None, help="the k in use, for the hold rule")
    ap.add_argument("--kmin", type=int, default=0)
    ap.add_argument("--kmax", type=int, default=64)
    ap.add_argument("--per-projection", action="store_true", help="also k* of every projection alone")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    k0, hists = load_profile(a.profile)
    H = pooled(hists)
    try:
        res = select(H, a.kmin, a.kmax, a.held)
        if a.per_projection:
            res["per_projection"] = {n: select(h, a.kmin, a.kmax)["k_star"] for n, h in hists.items()}
    except ValueError as e:
        fail(f"{a.profile}: {e}")
    res["profiled_with_k"] = k0
    res["samples"] = sum(H.values())
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{a.profile}: {res['samples']} samples over {len(hists)} projections (profiled with k={k0}); "
          f"codes {min(H)}..{max(H)} unscaled")
    print(f"K_safe = [{res['k_safe'][0]}, {res['k_safe'][1]}]   k* = {res['k_star']}   R_amp(k*) = {res['r_min']:.4g}")
    for k in sorted(res["r_amp"]):
        if k % 5 == 0 or k == res["k_star"] or k == a.held:
            mark = " <- k*" if k == res["k_star"] else (" <- held" if k == a.held else "")
            print(f"  k {k:3d}  R_amp {res['r_amp'][k]:.4e}{mark}")
    if a.held is not None:
        print(res["decision"])
    if a.per_projection:
        print("k* per projection: " + ", ".join(f"{n} {k}" for n, k in res["per_projection"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
