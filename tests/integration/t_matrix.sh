#!/usr/bin/env bash
# t_matrix.sh — every KV cache type × context policy × head size × backend
# path through the real daemon: each cell either generates or is refused
# with a message that names the true missing capability.
#
#   KV type      f32, f16, bf16, q8_0, q4_0, auto (--cache-type)
#   policy       error, truncate-oldest, sliding-window, sinks
#   head size    32 (tiny-mha), 64, 128, 256 (tiny-hd64, -hd128, -hd256)
#   path         avx512 (the CPU backend's best), avx2 (KVD_CPU_NO_AVX512),
#                generic C (KVD_CPU_GENERIC), cuda-emu (--backend cuda on the
#                emulated plug-in, tests/gpu/emu/build.sh)
#
# The expected answer of each cell is written out here from what each path
# implements, not asked of kvd:
#   - cache_type auto is bf16 on the avx512 path where the CPU has AVX-512
#     BF16 and the head size is 64, 128 or 256, else f16 (the log says which);
#   - the plug-in serves every KV type, as the CPU does (its query never
#     calls a type fast, so auto is f16 there);
#   - error and truncate-oldest generate 8 tokens (and error refuses 80
#     tokens past a 64-token context, naming the context window);
#   - the window policies generate past the window (a 16-token window with
#     pages of 16: the K/V dropped is > 0, so keys were re-rotated) on every
#     path with an f16, bf16 or f32 cache, and are refused naming "re-rotating
#     cached keys (kv_shift) of a T KV cache" and the backend otherwise
#     (neither the CPU's kv_shift nor the plug-in's quantizes keys again).
# A path the CPU lacks (no AVX-512 VNNI, no AVX2) is printed as n/a; no g++
# for the plug-in likewise. The matrix is printed; any unexpected cell fails.
# test-run: long
. "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
mkdir -p "$TINY_DIR"
GEN_PY=$ROOT/.venv/bin/python
[ -x "$GEN_PY" ] || GEN_PY=/usr/bin/python3
"$GEN_PY" "$ROOT/scripts/gen_tiny_models.py" "$TINY_DIR" --only mha,hd64,hd128,hd256 >/dev/null 2>&1 ||
	skip "cannot generate the tiny models (scripts/gen_tiny_models.py needs the gguf package of .venv)"
declare -A MODEL=([32]=$TINY_DIR/tiny-mha.gguf [64]=$TINY_DIR/tiny-hd64.gguf [128]=$TINY_DIR/tiny-hd128.gguf
	[256]=$TINY_DIR/tiny-hd256.gguf)

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }
PATHS=()
if has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512_vnni; then PATHS+=(avx512); else
	echo "path avx512: n/a (no AVX-512 VNNI here)"; fi
if has avx2 && has fma && has f16c; then PATHS+=(avx2); else echo "path avx2: n/a (no AVX2 here)"; fi
PATHS+=(generic)
EMU=$ROOT/$BUILD/gpu-emu
if "$ROOT/tests/gpu/emu/build.sh" "$EMU" >"$T/emu-build.log" 2>&1; then PATHS+=(cuda-emu); else
	rc=$?
	[ $rc -eq 77 ] || { cat "$T/emu-build.log"; fail "the emulated CUDA plug-in does not build"; }
	echo "path cuda-emu: n/a ($(tail -n 1 "$T/emu-build.log"))"
fi
BF16_PRODUCTS=0
has avx512_bf16 && BF16_PRODUCTS=1

KVS=(f32 f16 bf16 q8_0 q4_0 auto)
POLICIES=(error truncate-oldest sliding-window sinks)
PROMPT="the quick brown fox jumps over the lazy dog"
# the window policies' prompt (48 tokens): past sinks + window before the
# first generated token, so a drop (and kv_shift) happens however soon a
# path's greedy tokens reach EOS, and 8 generated tokens are enough
WPROMPT="$PROMPT, then the lazy dog sleeps"
S=$T/kvd.sock
bad=0
declare -A CELL

# expected KV type of the pool for PATH HD KV
eff_kv() {
	local path=$1 hd=$2 kv=$3
	[ "$kv" != auto ] && { echo "$kv"; return; }
	if [ "$path" = avx512 ] && [ $BF16_PRODUCTS = 1 ] && [ "$hd" -ge 64 ]; then echo bf16; else echo f16; fi
}

# run_daemon PATH HD KV: kvd in the background (KVD_PID) or, when it
# refuses to start, returns 1 with its log in $T/kvd.log
run_daemon() {
	local path=$1 hd=$2 kv=$3 env=() args=()
	case $path in
	avx2) env=(KVD_CPU_NO_AVX512=1) ;;
	generic) env=(KVD_CPU_GENERIC=1) ;;
	cuda-emu) env=(KVD_CUDA_PLUGIN="$EMU/libkvd-cuda.so"); args=(--backend cuda) ;;
	*) args=(--backend cpu) ;;
	esac
	env "${env[@]}" "$KVD" --config /dev/null --socket "$S" --model "${MODEL[$hd]}" --threads 1 --max-model-len 64 \
		--pool-size 4M --block-size 16 --cache-type "$kv" "${args[@]}" 2>"$T/kvd.log" &
	KVD_PID=$!
	PIDS+=("$KVD_PID")
	local i
	for i in $(seq 1 1500); do
		kill -0 "$KVD_PID" 2>/dev/null || { wait "$KVD_PID" 2>/dev/null; return 1; }
		"$RAW" -s "$S" hello >/dev/null 2>&1 && return 0
		sleep 0.02
	done
	fail "kvd ($path, head size $hd, $kv) not ready after 30 s"
}

mismatch() { # CELL-NAME WHAT
	echo "MISMATCH $1: $2" >&2
	bad=$((bad + 1))
}

# gen POLICY: one request under the policy; sets OUT and RC
gen() {
	local p=$1 extra=(--max-tokens 8) prompt=$PROMPT
	case $p in
	sliding-window) extra=(--max-tokens 8 --window 16); prompt=$WPROMPT ;;
	sinks) extra=(--max-tokens 8 --window 16 --sinks 4); prompt=$WPROMPT ;;
	esac
	OUT=$(KVD_SOCKET=$S "$KVCTL" generate --raw --temperature 0 --context-policy "$p" "${extra[@]}" --json "$prompt" 2>&1)
	RC=$?
}

for path in "${PATHS[@]}"; do
	where=cpu
	[ "$path" = cuda-emu ] && where=cuda
	for hd in 32 64 128 256; do
		for kv in "${KVS[@]}"; do
			ek=$(eff_kv "$path" "$hd" "$kv")
			name="$path/hd$hd/$kv"
			if ! run_daemon "$path" "$hd" "$kv"; then
				msg=$(grep -m1 '^<3>' "$T/kvd.log" | sed 's/^<3>//')
				for p in "${POLICIES[@]}"; do CELL[$name/$p]="no start"; done
				mismatch "$name" "kvd did not start: $msg"
				continue
			fi
			grep -q "; $where backend" "$T/kvd.log" ||
				mismatch "$name" "not served on the $where backend: $(grep -m1 "backend$" "$T/kvd.log")"
			grep -q "$ek K/V" "$T/kvd.log" ||
				mismatch "$name" "the pool is not $ek: $(grep -m1 'KV pool' "$T/kvd.log")"
			for p in "${POLICIES[@]}"; do
				gen "$p"
				case $p in
				error | truncate-oldest)
					if [ $RC -eq 0 ]; then CELL[$name/$p]=ok; else
						CELL[$name/$p]="FAIL"; mismatch "$name/$p" "$OUT"; fi
					if [ "$p" = error ]; then
						o=$(KVD_SOCKET=$S "$KVCTL" generate --raw --max-tokens 80 "$PROMPT" 2>&1) &&
							mismatch "$name/$p" "80 tokens past a 64-token context were accepted"
						echo "$o" | grep -q "context window" ||
							mismatch "$name/$p" "the overflow refusal does not name the context window: $o"
					fi
					;;
				*)
					if [ "$ek" = f16 ] || [ "$ek" = bf16 ] || [ "$ek" = f32 ]; then
						drop=$(echo "$OUT" | $PY -c 'import json,sys; print(json.load(sys.stdin)["context_dropped_tokens"])' 2>/dev/null)
						if [ $RC -eq 0 ] && [ "${drop:-0}" -gt 0 ]; then CELL[$name/$p]="ok, $drop dropped"; else
							CELL[$name/$p]="FAIL"; mismatch "$name/$p" "expected a generation past the window (rc $RC): $OUT"; fi
					else
						CELL[$name/$p]="refused: kv_shift"
						[ $RC -ne 0 ] || mismatch "$name/$p" "a $ek cache on $where was not refused"
						echo "$OUT" | grep -q "re-rotating cached keys (kv_shift) of a $ek KV cache, which the $where backend" ||
							{ CELL[$name/$p]="FAIL"; mismatch "$name/$p" "refusal does not name kv_shift of $ek on $where: $OUT"; }
					fi
					;;
				esac
			done
			stop_kvd "$KVD_PID" >/dev/null 2>&1
		done
	done
done

for path in "${PATHS[@]}"; do
	echo
	printf '%-8s %-5s %-9s' "$path" head kv
	for p in "${POLICIES[@]}"; do printf ' | %-19s' "$p"; done
	echo
	for hd in 32 64 128 256; do
		for kv in "${KVS[@]}"; do
			k=$kv
			[ "$kv" = auto ] && k="auto=$(eff_kv "$path" "$hd" auto)"
			printf '%-8s %-5s %-9s' "" "$hd" "$k"
			for p in "${POLICIES[@]}"; do printf ' | %-19s' "${CELL[$path/hd$hd/$kv/$p]:-?}"; done
			echo
		done
	done
done
echo
[ $bad -eq 0 ] || fail "$bad cells of the matrix are not what the backends implement (see MISMATCH above)"
ok "every cell of the KV type x context policy x head size x backend path matrix works or names its missing capability"
