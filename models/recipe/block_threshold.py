#!/usr/bin/env python3
"""Choose the bundled policy's `[cascade] accept_risk_below` for a model: the confidence a `risk`
verdict of the cpu tier needs to stand (and block) instead of going to the rules (a review).

Usage:
    python3 models/recipe/block_threshold.py DECISIONS.jsonl [...] [--fresh-ok 420 --bar 0.01 --risk 0.05]

Input: the `--decisions` files of `blind_report.py` ({"truth", "decision"} per line), measured with
the policy's current threshold (which must be at least every candidate: the files then hold the
cpu tier's score of every verdict that went to the rules for want of confidence). Use spent
sets only (blind sets already measured, check sets): a set used here is no longer blind.

For each candidate t (0.90 to 0.97 by 0.01) a review whose first cpu step was `low_confidence`
with risk_score >= max(t, accept_below) and within `ood_above` is counted as a block (the verdict
would have stood: action from `block_at`; guards only raise). Prints per file and pooled: ordinary
messages blocked (with the Wilson 95 % upper bound, Wilson 1927), risk allowed, review share.
Chooses the lowest t at which a fresh set of FRESH_OK ordinary messages (420: a blind set's)
would break issue 26's bar (more than 1 % blocked, i.e. 5 or more) with probability at most 5 %,
blocks counted as negative binomial (gamma-Poisson): the pooled rate, and the spread of the rate
between the files beyond Poisson's by the method of moments (sets written by different people
differ: `ml17` blocked 6 of 420 where the pooled Poisson rate said 1.8 expected, P 1 %); Poisson
where the files show no extra spread. Confirm the choice by measuring the files' sets again
through a server with it.
"""

import argparse
import collections
import json
import math

ACCEPT_BELOW = 0.9  # policies/routing.toml [cascade] accept_below: no verdict stands below it
OOD_ABOVE = 0.99  # [cascade] ood_above


def wilson_upper(k, n, z=1.96):
    if n == 0:
        return float("nan")
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + spread) / (1 + z * z / n)


def poisson_at_least(k, lam):
    return 1.0 - sum(math.exp(-lam) * lam**i / math.factorial(i) for i in range(k))


def rate_spread(counts):
    """Pooled rate r and between-set variance s2 of the per-set rates beyond Poisson's, by the method
    of moments for a gamma-Poisson mixture with exposures (k_i blocked of n_i ordinary): r = sum k /
    sum n; s2 = (sum n_i (k_i/n_i - r)^2 - (N - 1) r) / (N - sum n_i^2 / N), N = sum n_i (the
    DerSimonian-Laird form for rates); 0 when the sets spread no more than Poisson."""
    counts = [(k, n) for k, n in counts if n > 0]
    big_n = sum(n for _, n in counts)
    r = sum(k for k, _ in counts) / big_n
    q = sum(n * (k / n - r) ** 2 for k, n in counts)
    denom = big_n - sum(n * n for _, n in counts) / big_n
    s2 = (q - (len(counts) - 1) * r) / denom if denom > 0 else 0.0
    return r, max(s2, 0.0)


def negbin_at_least(k, mean, var):
    """P(K >= k) for a count with this mean and variance >= mean (negative binomial; Poisson at equality)."""
    if var <= mean * (1 + 1e-9) or mean <= 0:
        return poisson_at_least(k, mean)
    size = mean * mean / (var - mean)
    p = size / (size + mean)
    pmf = lambda i: math.exp(math.lgamma(i + size) - math.lgamma(size) - math.lgamma(i + 1) + size * math.log(p) + i * math.log1p(-p))
    return 1.0 - sum(pmf(i) for i in range(k))


def action_at(row, t):
    d = row["decision"]
    if d["action"] != "review":
        return d["action"]
    cpu = [s for s in d["path"] if s["tier"] == "cpu"]
    if not cpu or cpu[0].get("outcome") != "low_confidence":
        return "review"
    s = cpu[0]
    if s.get("risk_score", 0) >= max(t, ACCEPT_BELOW) and s.get("ood_score", 0) <= OOD_ABOVE:
        return "block"
    return "review"


def tally(rows, t):
    c = collections.Counter()
    for r in rows:
        c[(r["truth"], action_at(r, t))] += 1
    n_ok = sum(v for (truth, _), v in c.items() if truth == "ok")
    review = (c[("ok", "review")] + c[("risk", "review")]) / max(len(rows), 1)
    return c[("ok", "block")], n_ok, c[("risk", "allow")], review


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--fresh-ok", type=int, default=420, help="ordinary messages in a fresh blind set")
    ap.add_argument("--bar", type=float, default=0.01, help="share of them the bar lets be blocked")
    ap.add_argument("--risk", type=float, default=0.05, help="accepted probability of breaking the bar")
    args = ap.parse_args()
    sets = {f: [json.loads(l) for l in open(f, encoding="utf-8") if l.strip()] for f in args.files}
    pooled = [r for rows in sets.values() for r in rows]
    chosen, holds = None, True
    breaks = math.floor(args.bar * args.fresh_ok) + 1
    print(f"{'t':>5} {'ok blocked (pooled)':>22} {'95% upper':>9} {'P(>=' + str(breaks) + ')':>8} {'risk allowed':>12} {'review':>7}   per file: ok blocked / review")
    for t in [0.97, 0.96, 0.95, 0.94, 0.93, 0.92, 0.91, 0.90]:
        blocked, n_ok, allowed, review = tally(pooled, t)
        per = "  ".join(f"{b}/{r:.3f}" for b, _, _, r in (tally(rows, t) for rows in sets.values()))
        r, s2 = rate_spread([tally(rows, t)[:2] for rows in sets.values()])
        m = args.fresh_ok
        p_break = negbin_at_least(breaks, r * m, r * m + s2 * m * m)
        print(f"{t:5.2f} {blocked:>10} / {n_ok:<5} {blocked / n_ok:6.2%} {wilson_upper(blocked, n_ok):9.2%} {p_break:8.3f} {allowed:>12} {review:7.1%}   {per}")
        # Candidates run from the strictest down: the first that breaks the bar ends the choice.
        holds = holds and p_break <= args.risk
        if holds:
            chosen = t
    print(f"chosen: accept_risk_below = {chosen} (lowest t, every t above it too, with P(>= {breaks} of {args.fresh_ok} ordinary blocked) <= {args.risk})")


if __name__ == "__main__":
    main()
