#!/usr/bin/env bash
# t_kv_cache_type.sh — [kv] cache_type end to end on the default model.
#
#   - kvd started with --cache-type q8_0 (q4_0, bf16) lays its pages out for the
#     type: `kvctl stats` and `kvctl plan` report the type and bytes per token the
#     block format gives (2 x layers x KV heads x head_dim / 32 x 34, 18 or 64,
#     the shape read from the GGUF file by the gguf package, not by kvd), and
#     it serves a generation;
#   - the determinism guarantee holds for quantized and bf16 caches: with
#     q8_0, q4_0 and bf16, a prompt's logits are bit-identical under other
#     page sizes, shuffled pages, chunked prefill, other thread counts, and in
#     a batch, and for q8_0 and q4_0 the AVX2 build's are the AVX-512 build's
#     (where the CPU has both);
#   - at depth (1,130 tokens, f16, bf16 and q8_0) a prompt's logits are the same bits
#     prefilled in one tile or token by token, on 1 or 2 threads (single
#     tokens deep in a context take whole attention chunks a thread);
#   - a bf16 daemon names its type to 0.5 clients (kvctl stats and plan say
#     bf16, not f16, whose size it has), and 0 to older ones;
#   - the default, auto, is bf16 where the CPU has AVX-512 BF16 (and the
#     model's head size a bf16 kernel), f16 with KVD_CPU_NO_AVX512.
# Their quality is measured by t_kv_quality.sh.
# test-run: long
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "the default model is missing (scripts/setup)"
EVAL=$ROOT/$BUILD/tests/kvd_eval
[ -x "$EVAL" ] || skip "$EVAL not built"
GPY=$ROOT/.venv/bin/python
"$GPY" -c 'import gguf' 2>/dev/null || skip "the gguf package (.venv, scripts/setup) is missing"

# the model's KV shape, from the file
read -r L H D < <("$GPY" - "$REAL_MODEL" <<'EOF'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
f = lambda k: int(r.fields[k].parts[-1][0])
print(f("llama.block_count"), f("llama.attention.head_count_kv"),
      f("llama.embedding_length") // f("llama.attention.head_count"))
EOF
)
[ -n "${D:-}" ] && [ $((D % 32)) = 0 ] || fail "model shape from the file: layers '$L', KV heads '$H', head dim '$D'"

# ---- the daemon with a quantized cache -------------------------------------------------
for ty in q8_0 q4_0 bf16; do
	case $ty in q8_0) per32=34 ;; q4_0) per32=18 ;; bf16) per32=64 ;; esac
	want=$((2 * L * H * D / 32 * per32))
	S=$T/$ty.sock
	start_kvd "$ty" "$S" --model "$REAL_MODEL" --backend cpu --pool-size 32M --cache-type $ty
	grep -q "$ty K/V" "$T/$ty.log" || fail "$ty: the start-up log does not name the KV type"
	got=$(stat_of "$S" kv_bytes_per_token)
	[ "$got" = "$want" ] || fail "$ty: stats kv_bytes_per_token $got, expected $want (2 x $L x $H x $D / 32 x $per32)"
	KVD_SOCKET=$S "$KVCTL" plan --json --context 2048 >"$T/plan.json" || fail "$ty: kvctl plan failed"
	"$PY" - "$T/plan.json" "$ty" "$want" <<'EOF' || fail "$ty: kvctl plan: $(cat "$T/plan.json")"
import json, sys
p = json.load(open(sys.argv[1]))
want = int(sys.argv[3])
assert p["cache_type"] == sys.argv[2], p["cache_type"]
assert p["kv_bytes_per_token"] == want, p["kv_bytes_per_token"]
assert p["page_bytes"] == want * p["block_size"], p["page_bytes"]
b = p["budgets"][0]
assert b["pages"] == b["memory_bytes"] // p["page_bytes"]
assert b["sequences"] == b["pages"] // p["pages_per_request"]
EOF
	case $ty in bf16) line="x 2 bytes ($ty) = $want B" ;; *) line="x $per32/32 bytes ($ty) = $want B" ;; esac
	grep -qF "$line" <<<"$(KVD_SOCKET=$S "$KVCTL" plan --context 2048)" ||
		fail "$ty: kvctl plan does not show the block size: $(KVD_SOCKET=$S "$KVCTL" plan)"
	grep -q "per token, $ty)" <<<"$(KVD_SOCKET=$S "$KVCTL" stats)" ||
		fail "$ty: kvctl stats does not name the type: $(KVD_SOCKET=$S "$KVCTL" stats | head -2)"
	# WELCOME names the type (enum + 1) to 0.5 clients, and says 0 to older ones
	case $ty in q8_0) kt=3 ;; q4_0) kt=4 ;; bf16) kt=5 ;; esac
	"$RAW" -s "$S" hello | grep -q " kv_type $kt\$" || fail "$ty: WELCOME kv_type: $("$RAW" -s "$S" hello)"
	KVD_RAW_CLIENT_VERSION=0x000400 "$RAW" -s "$S" hello | grep -q " kv_type 0\$" ||
		fail "$ty: a 0.4 client got a kv_type: $(KVD_RAW_CLIENT_VERSION=0x000400 "$RAW" -s "$S" hello)"
	KVD_SOCKET=$S "$KVCTL" generate --raw --temperature 0 --max-tokens 8 "The capital of France is" >"$T/gen.out" ||
		fail "$ty: generate failed"
	[ -s "$T/gen.out" ] || fail "$ty: empty generation"
	stop_kvd "$KVD_PID" || fail "$ty: kvd exited with status $?"
	ok "$ty: $want bytes per token in stats and plan; generated '$(head -c 60 "$T/gen.out" | tr '\n' ' ')'"
done

# ---- deep contexts: a token decoded alone far into its context takes whole ----
# attention chunks a thread (all KV heads; f16 and bf16 through the heads
# kernel, position by position), one in a prefill tile a chunk of one head at
# a time; the logits must be the same bits either way
deep=$(seq -s, 100 1 1229)   # 1,130 tokens: 9 chunks of 128 positions
for ty in f16 bf16 q8_0; do
	base=(--model "$REAL_MODEL" --tokens "$deep" --n-predict 3 --cache-type $ty --threads 2)
	"$EVAL" "${base[@]}" --logits-out "$T/deep.bin" >/dev/null || fail "$ty deep: kvd_eval failed"
	for v in "--chunk 1" "--threads 1"; do
		# shellcheck disable=SC2086
		"$EVAL" "${base[@]}" $v --logits-out "$T/deepv.bin" >/dev/null || fail "$ty deep $v: kvd_eval failed"
		cmp -s "$T/deep.bin" "$T/deepv.bin" || fail "$ty: logits at depth 1,130 differ under $v"
	done
	ok "$ty: logits at depth 1,130 bit-identical prefilled in one tile, token by token, on 1 and 2 threads"
done

# ---- the default, cache_type = auto: bf16 where the CPU backend has bfloat16 products ----
want_auto=f16
grep -qw avx512_bf16 /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
	grep -qw avx512dq /proc/cpuinfo && [ "$D" -eq 64 ] && want_auto=bf16
for env in "" KVD_CPU_NO_AVX512=1; do
	want=$want_auto
	[ -n "$env" ] && want=f16
	S=$T/auto.sock
	env $env "$KVD" --config /dev/null --socket "$S" --model "$REAL_MODEL" --backend cpu --pool-size 16M \
		2>"$T/auto.log" &
	KVD_PID=$!
	PIDS+=("$KVD_PID")
	for _ in $(seq 1 600); do "$RAW" -s "$S" hello >/dev/null 2>&1 && break; sleep 0.1; done
	grep -q "$want K/V (cache_type auto)" "$T/auto.log" || fail "auto${env:+ with $env}: expected $want: $(grep 'KV pool' "$T/auto.log")"
	grep -q "per token, $want)" <<<"$(KVD_SOCKET=$S "$KVCTL" stats)" || fail "auto: kvctl stats does not say $want"
	stop_kvd "$KVD_PID" || fail "auto: kvd exited with status $?"
	ok "cache_type auto${env:+ with $env}: $want"
done

# ---- determinism with quantized and bf16 caches --------------------------------------------
toks=$(seq -s, 100 3 550)   # 151 tokens: two attention chunks of 128 positions
for ty in q8_0 q4_0 bf16; do
	base=(--model "$REAL_MODEL" --tokens "$toks" --n-predict 4 --cache-type $ty)
	"$EVAL" "${base[@]}" --logits-out "$T/base.bin" >/dev/null || fail "$ty: kvd_eval failed"
	for v in "--block-size 1" "--block-size 64" "--shuffle-seed 7" "--chunk 7" "--chunk 1" "--threads 1" "--threads 2"; do
		# shellcheck disable=SC2086
		"$EVAL" "${base[@]}" $v --logits-out "$T/v.bin" >/dev/null || fail "$ty $v: kvd_eval failed"
		cmp -s "$T/base.bin" "$T/v.bin" || fail "$ty: logits differ under $v"
	done
	printf '%s\n%s\n%s\n' "$toks" "$(seq -s, 7 11 300)" "$(seq -s, 900 2 930)" >"$T/batch.txt"
	"$EVAL" --model "$REAL_MODEL" --batch-file "$T/batch.txt" --n-predict 4 --cache-type $ty --block-size 1 \
		--shuffle-seed 3 --logits-out "$T/batch.bin" >/dev/null || fail "$ty: batch failed"
	cmp -s "$T/base.bin" "$T/batch.bin.0" || fail "$ty: logits in a batch of 3 differ from solo"
	ok "$ty: logits bit-identical under page sizes 1/64, shuffled pages, chunks 7/1, 1/2 threads, a batch"
	# the quantized attention is one arithmetic in every build, and the
	# rest of the AVX2 build matches the AVX-512 one (tiled GEMMs): so the
	# whole model's logits do too (with f16 K/V they do not: its attention
	# kernels differ)
	if [ "$ty" = bf16 ]; then
		: # bf16 attention runs on bfloat16 products where the CPU has them (AVX-512 BF16), on floats in the AVX2 build
	elif grep -qw avx512f /proc/cpuinfo; then
		KVD_CPU_NO_AVX512=1 "$EVAL" "${base[@]}" --logits-out "$T/avx2.bin" >/dev/null || fail "$ty: AVX2 run failed"
		cmp -s "$T/base.bin" "$T/avx2.bin" || fail "$ty: the AVX2 build's logits differ from the AVX-512 build's"
		ok "$ty: the AVX2 build's logits are the AVX-512 build's, bit for bit"
	else
		echo "skipped: no AVX-512 on this CPU: the AVX2 and AVX-512 builds of $ty are not compared here"
	fi
done
