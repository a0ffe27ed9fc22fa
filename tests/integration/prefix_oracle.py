#!/usr/bin/env python3
"""prefix_oracle.py — the cross-user prefix-cache oracle, run against a live kvd.

A victim (one uid) sends a system prompt holding a secret PIN; an attacker
(another uid) sends the same text with guessed PINs and watches what the
cache tells it: its request's cached_tokens and its time to first token.
In the scoped run each attacker trial is in a fresh tenant of its own, so
the attacker's own earlier guesses never hit its own cache: whatever a right
guess gains over a wrong one can only come from the victim's pages.

  prefix_oracle.py --kvctl PATH --socket S --victim "setpriv ..." \
      --attacker "setpriv ..." --trials N --expect scoped|leaky

scoped: every attacker cached_tokens is 0 and the right guesses' TTFT is not
distinguishable from the wrong ones' (Mann-Whitney |z| < 3.5), while the
victim's own resend does hit (so the cache works and the test could see it).
leaky: the right guesses get cached_tokens well above the wrong ones' (the
control that shows the oracle is real when sharing is machine-wide).
Prints one summary line with the figures; exits 1 on a failed expectation.
"""
import argparse
import json
import math
import random
import shlex
import subprocess
import sys

PREAMBLE = ("You are the assistant of the Harbor Street branch of a small bank. Answer customers politely, "
            "never reveal internal procedures, and keep every answer under three sentences. Opening hours are "
            "nine to five on weekdays and nine to noon on Saturdays. The branch manager is Ms. Okafor. ")
SUFFIX = ("Never tell anyone the PIN, whatever they claim to be, and do not confirm or deny guesses. If asked about "
          "the vault, say that only the manager can discuss it. Loans are handled by appointment: offer the "
          "customer a time slot on the next working day and ask for their account number. Mortgages, savings "
          "accounts and card replacements are handled at the front desk. Be brief.")


def prompt(pin):
    return PREAMBLE + "The vault PIN is " + pin + ". " + SUFFIX


def generate(args, who, text, tenant=None):
    cmd = shlex.split(who) + [args.kvctl, "--socket", args.socket, "generate", "--raw", "--max-tokens", "1",
                              "--temperature", "0", "--json"]
    if tenant:
        cmd += ["--tenant", tenant]
    cmd += ["--", text]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        sys.exit(f"FAIL: kvctl generate as '{who}' failed ({out.returncode}): {out.stderr.strip()} {out.stdout.strip()}")
    j = json.loads(out.stdout)
    if "error" in j:
        sys.exit(f"FAIL: generate error: {j['error']}")
    return j


def mann_whitney_z(a, b):
    """z of the Mann-Whitney U statistic (normal approximation, ties averaged)."""
    allv = sorted((v, i) for i, v in enumerate(a + b))
    ranks = [0.0] * len(allv)
    i = 0
    while i < len(allv):
        j = i
        while j + 1 < len(allv) and allv[j + 1][0] == allv[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[allv[k][1]] = (i + j) / 2 + 1
        i = j + 1
    n1, n2 = len(a), len(b)
    r1 = sum(ranks[:n1])
    u = r1 - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    sd = math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    return (u - mu) / sd


def median(v):
    s = sorted(v)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvctl", required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--victim", required=True)
    ap.add_argument("--attacker", required=True)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--expect", choices=["scoped", "leaky"], required=True)
    ap.add_argument("--tag", default="t")
    args = ap.parse_args()

    secret = "7391"
    rng = random.Random(7)
    # The victim's prompt, sent twice: the second must hit its own cache.
    v1 = generate(args, args.victim, prompt(secret))
    v2 = generate(args, args.victim, prompt(secret))
    n_prompt = v1["prompt_tokens"]
    if v2["cached_tokens"] < n_prompt // 2:
        sys.exit(f"FAIL: the victim's own resend hit only {v2['cached_tokens']} of {n_prompt} tokens")

    right, wrong, right_cached, wrong_cached = [], [], [], []
    for i in range(args.trials):
        guess = secret if i % 2 == 0 else "%04d" % rng.choice([x for x in range(1000, 10000) if x != 7391])
        # (a tenant narrows even machine-wide sharing: the leaky control sends none)
        tenant = f"{args.tag}-{i}" if args.expect == "scoped" else None
        j = generate(args, args.attacker, prompt(guess), tenant=tenant)
        if j["prompt_tokens"] != n_prompt:
            continue  # a guess that tokenizes to another length is not comparable
        (right if guess == secret else wrong).append(j["ttft_ms"])
        (right_cached if guess == secret else wrong_cached).append(j["cached_tokens"])
    if len(right) < args.trials // 4 or len(wrong) < args.trials // 4:
        sys.exit(f"FAIL: too few comparable trials ({len(right)} right, {len(wrong)} wrong)")
    z = mann_whitney_z(right, wrong)
    line = (f"{args.expect}: prompt {n_prompt} tokens, victim resend cached {v2['cached_tokens']}; attacker "
            f"{len(right)} right / {len(wrong)} wrong guesses: cached_tokens max {max(right_cached)} / "
            f"{max(wrong_cached)}, mean {sum(right_cached) / len(right_cached):.1f} / "
            f"{sum(wrong_cached) / len(wrong_cached):.1f}; TTFT median {median(right):.1f} / {median(wrong):.1f} ms, "
            f"Mann-Whitney z = {z:.2f}")
    print(line)
    if args.expect == "scoped":
        if max(right_cached) or max(wrong_cached):
            sys.exit("FAIL: the attacker got cached tokens from another user's prompt: " + line)
        if abs(z) >= 3.5:
            sys.exit("FAIL: the attacker's TTFT tells right guesses from wrong ones: " + line)
    else:
        if min(right_cached) <= max(wrong_cached):
            sys.exit("FAIL: with machine-wide sharing the oracle should see the victim's pages: " + line)


if __name__ == "__main__":
    main()
