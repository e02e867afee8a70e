#!/bin/bash
# bench/device_steps.sh -- the usual steps of a GPU call, so that a session does not rewrite them.
#
# Here, before the call (this machine builds; the device machine's Python 3.12 has torch and
# CuPy but no cffi, and its copy of the tree keeps the session's first .git):
#     make -j4 cuda && bash bench/device_steps.sh prepare
# writes the cffi and pycparser wheels for Python 3.12 and the commit's name (and whether
# native/ or mojo_train/ differ from it) into .whl/, with the libraries and programs a GPU call
# uses in .whl/build/ (the CPU, CUDA and emulated-Metal libraries, the probe: all of native/build is over the
# tool's 64 MiB). Then call the device tool's `run` with carry [".whl"] and a command such as
#     bash bench/device_steps.sh cards suite bench=rms_norm_cuda
# Each step's output goes to $OUT/logs/<step>.txt, and everything comes back as $OUT/logs.tgz
# (one file: the tool returns at most eight). Steps:
#     cards              every card on CUDA (python -m mojo_train selfcheck, MOJO_TRAIN_VENDOR=cuda): the
#                        identical cards, then identical_ftz's on its library
#     suite              the suite on the CUDA libraries only (MOJO_TRAIN_VENDOR=cuda: without it
#                        every test runs for the CPU libraries too, twice the time), verbose, so a
#                        run cut by its limit ($SUITE_T seconds, default 420) still names what failed;
#                        $SUITE_K, when set, is pytest's -k (e.g. "not sabotaged": those builds are slow)
#     test=FILE          one test file on CUDA
#     tests=LIST         the pytest arguments in the file LIST (test ids, -n, -k ...) on CUDA, long
#                        tracebacks, into tests_<LIST's name>.txt: a previous call's failures again
#     bench=NAME         bench/NAME.py --write in three processes (targets hold on the median of
#                        three); the results file comes back in the archive
#     ncu=KERNEL:NAME    ncu --set full over the first launch of KERNEL (a regular expression) in
#                        bench/NAME.py, as the per-instruction table (sass_KERNEL.csv) and the
#                        details (details_KERNEL.csv; KERNEL's other characters as _)
#     sanitize           make sanitize-cuda with $SANITIZE_CUDA_ARGS (the Makefile's default: --mps; with
#                        --no-build, its canary native/build/sanitizer_canaries is made here: see
#                        bench/sanitize_cuda.py's build step, and prepare carries it)
#     py=NAME            bench/NAME.py once, its output in py_NAME.txt (e.g. py=timeline_cuda)
#     ab=NAME[:V,...]    bench/NAME.py (no --write) in three rounds of alternating processes: the tree's
#                        libraries, then each variant folder .whl/v*/ (or only those named: ab=NAME:vX,vY),
#                        into ab_NAME.txt. A variant is
#                        a library built here (e.g. `make BUILD=/tmp/vX NVCC="nvcc -D..."
#                        /tmp/vX/libmojo_train_cuda_identical.so`, copied with its .sha256 into
#                        .whl/vX/), or another commit's Python (its mojo_train/ and bench/ copied into
#                        .whl/vX/: its bench/NAME.py runs there over the tree's libraries, or over
#                        its own in .whl/vX/native/build/ with its native/include/, for another ABI)
#     abenv=NAME:VAR=V[,VAR=V...]  bench/NAME.py (no --write) in three rounds of alternating processes
#                        over the tree's libraries: as the environment has it, then with the
#                        variables set (an A/B switch the library reads, e.g. MOJO_TRAIN_RMS_ONE_PASS=0),
#                        into abenv_NAME.txt
#     lib=DIR            the steps after it load DIR's libraries first (MOJO_TRAIN_LIBRARY_PATH; "-" ends
#                        that); ncu's tables then carry DIR's name (ab='s tree rounds never do)
#     ftz_probe          native/build/ftz_probe_cuda (make it here: bench/ftz_probe_cuda.cu): how the GPU's
#                        flush treats each case of native/contracts/ftz.md, as JSON (ftz_probe.json)
#     unguarded_sweep    native/build/unguarded_sweep_cuda_identical and _identical_ftz (make them here:
#                        bench/unguarded_sweep_cuda.cu): the unguarded quotient and root against IEEE's
#                        on every input of their callers, one JSON line each (unguarded_sweep.txt)
set -u
cd "$(dirname "$0")/.."
# Each CUDA library was built from today's sources and flags, whatever the file times say: its
# <lib>.sources (the digest the build took) is `make cuda-sources` now, file for file. With
# "all", a missing library is refused too (prepare); else only the libraries there are checked.
# (identical_ftz's is built where clang and llvm-link are: checked when it is there, never required)
CUDA_LIBS="native/build/libmojo_train_cuda_identical.so native/build/libmojo_train_cuda_deterministic.so
           native/build/libmojo_train_cuda_fast.so"
OPTIONAL_CUDA_LIBS="native/build/libmojo_train_cuda_identical_ftz.so"
built_from_these_sources() {
    local now lib ok=0
    # sorted: make's $(wildcard) lists a folder in its file system's order, which differs there
    now=$(make -s --no-print-directory cuda-sources | sort) || return 1
    for lib in $CUDA_LIBS $OPTIONAL_CUDA_LIBS; do
        if [ ! -f "$lib" ]; then
            if [ "${1:-}" = all ] && [[ " $CUDA_LIBS " == *" $lib "* ]]; then echo "$lib is missing: make -j4 cuda"; ok=1; fi
        elif [ "$(sort "$lib.sources" 2>/dev/null)" != "$now" ]; then
            echo "$lib was not built from these sources and flags:"
            diff <(sort "$lib.sources" 2>/dev/null) <(echo "$now") | grep '^[<>]' | head -5
            echo "rebuild with: make -B -j4 cuda"; ok=1
        fi
    done
    return $ok
}
if [ "${1:-}" = prepare ]; then
    mkdir -p .whl
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 -d .whl cffi pycparser || exit 1
    built_from_these_sources all || exit 1
    rm -rf .whl/build && mkdir -p .whl/build
    for f in native/build/libmojo_train_cpu_* native/build/libmojo_train_cuda_* native/build/libmojo_train_metal_emulated_* \
             native/build/ftz_probe_cuda native/build/unguarded_sweep_cuda_* native/build/sanitizer_canaries; do
        [ -f "$f" ] && cp -p "$f" .whl/build/
    done
    git rev-parse --short HEAD > .whl/commit
    # the staging's own name, also left in the native/build it came from: restored only where
    # native/build is not that one (the device), once per staging
    echo "$(date +%s%N)-$$" > .whl/stage_id && cp .whl/stage_id native/build/.stage_id
    if [ -n "$(git status --porcelain -- native mojo_train)" ]; then echo 1; else echo 0; fi > .whl/dirty
    echo "prepared: $(ls .whl | tr '\n' ' ')(commit $(cat .whl/commit), dirty $(cat .whl/dirty))"
    # the device tool refuses a tree (tracked and untracked-not-ignored files, plus what is
    # carried) over 64 MiB: say so here, before a call is spent on it
    tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    whl=$(du -sb .whl | cut -f1)
    echo "the call's tree: $(( (tree + whl) / 1048576 )) MiB of 64 (.whl $(( whl / 1048576 )) MiB)"
    if [ $(( tree + whl )) -gt $(( 64 * 1048576 )) ]; then
        echo "over the device tool's 64 MiB: drop a variant folder .whl/v*/ or a library the call does not use"
        exit 5
    fi
    exit 0
fi
[ $# -gt 0 ] || { sed -n '2,30p' "$0"; exit 2; }
: "${OUT:?OUT must name the folder whose files come back (the device tool sets it)}"
python3 -c "import cffi" 2>/dev/null ||
    python3 -m pip install -q --root-user-action=ignore --no-index --find-links .whl cffi pycparser 2>&1 | tail -2
python3 -c "import cffi" || { echo "no cffi: run 'bash bench/device_steps.sh prepare' here and carry .whl"; exit 3; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# The staged libraries are the build on the device (its native/build is not the one they came
# from: .whl/stage_id), replacing whatever an earlier call left there; where they came from (this
# script's own tests run it here) native/build is the build, and may be newer: a copy here once put
# the staged, older libraries back over this session's fresh ones (twenty-fifth session).
if [ -d .whl/build ] && ! cmp -s .whl/stage_id native/build/.stage_id; then
    mkdir -p native/build && cp -p .whl/build/* native/build/ && cp .whl/stage_id native/build/.stage_id
fi
export MT_COMMIT=$(cat .whl/commit 2>/dev/null || echo unknown) MT_DIRTY=$(cat .whl/dirty 2>/dev/null || echo 1)
# The copy's sources are newer than its libraries, so make would rebuild them (a sanitize step
# builds): touched, but only the CUDA libraries and only once their stamps say they were built
# from this tree. (Touching all of native/build, as this script did, made a stale library look
# fresh to make wherever it ran -- this checkout's tests included: the nineteenth session's
# embedding kernels never reached the GPU for that.)
built_from_these_sources || exit 4
for lib in $CUDA_LIBS $OPTIONAL_CUDA_LIBS; do [ -f "$lib" ] && touch "$lib" "$lib.sha256" "$lib.sources" 2>/dev/null; done
L=$OUT/logs
mkdir -p "$L"
SUF=
for step in "$@"; do
    case $step in
    cards)
        MOJO_TRAIN_VENDOR=cuda timeout 300 python3 -m mojo_train selfcheck > "$L/cards.txt" 2>&1
        echo "rc=$?" >> "$L/cards.txt" ;;
    suite)
        MOJO_TRAIN_VENDOR=cuda timeout "${SUITE_T:-420}" python3 -m pytest -v -n 16 -rfEs --tb=short tests \
            ${SUITE_K:+-k "$SUITE_K"} > "$L/suite.txt" 2>&1
        echo "rc=$?" >> "$L/suite.txt"
        grep -E " (FAILED|ERROR) " "$L/suite.txt" > "$L/suite_failed.txt" ;;
    test=*)
        f=${step#test=}
        MOJO_TRAIN_VENDOR=cuda timeout 300 python3 -m pytest -q -n 8 -rfEs "tests/$f" > "$L/test_$f.txt" 2>&1
        echo "rc=$?" >> "$L/test_$f.txt" ;;
    tests=*)
        f=${step#tests=}
        MOJO_TRAIN_VENDOR=cuda timeout "${SUITE_T:-420}" python3 -m pytest -rfEs --tb=long $(cat "$f") \
            > "$L/tests_$(basename "$f").txt" 2>&1
        echo "rc=$?" >> "$L/tests_$(basename "$f").txt" ;;
    bench=*)
        b=${step#bench=}
        for k in 1 2 3; do timeout 200 python3 "bench/$b.py" --write >> "$L/bench_$b.txt" 2>&1; done
        cp "bench/results/$b.jsonl" "$L/" ;;
    ncu=*)
        spec=${step#ncu=}
        timeout 300 ncu --set full -k "regex:${spec%%:*}" -c 1 -f -o "$L/rep" python3 "bench/${spec#*:}.py" --repeat 3 \
            > "$L/ncu_run.txt" 2>&1
        k=$(echo "${spec%%:*}" | tr -c 'A-Za-z0-9_\n' _)
        ncu --import "$L/rep.ncu-rep" --page source --csv --print-source sass > "$L/sass_$k$SUF.csv" 2>&1
        ncu --import "$L/rep.ncu-rep" --page details --csv > "$L/details_$k$SUF.csv" 2>&1
        rm -f "$L/rep.ncu-rep" ;;
    py=*)
        s=${step#py=}
        timeout 300 python3 "bench/$s.py" > "$L/py_$s.txt" 2>&1
        echo "rc=$?" >> "$L/py_$s.txt" ;;
    ab=*)
        b=${step#ab=}
        only=
        case $b in *:*) only=",${b#*:},"; b=${b%%:*} ;; esac
        for round in 1 2 3; do
            echo "== round $round tree" >> "$L/ab_$b.txt"
            env -u MOJO_TRAIN_LIBRARY_PATH timeout 200 python3 "bench/$b.py" >> "$L/ab_$b.txt" 2>&1
            echo "rc=$?" >> "$L/ab_$b.txt"
            for v in .whl/v*/; do
                [ -z "$only" ] || [[ "$only" == *",$(basename "$v"),"* ]] || continue
                if [ -f "$v/bench/$b.py" ]; then
                    # its own libraries where it has them (another ABI), else the tree's
                    echo "== round $round $(basename "$v") (its Python)" >> "$L/ab_$b.txt"
                    (cd "$v" && libs=$OLDPWD/native/build && { [ ! -f native/build/libmojo_train_cuda_identical.so ] || libs=$PWD/native/build; } &&
                        PYTHONPATH=$PWD MOJO_TRAIN_LIBRARY_PATH=$libs timeout 200 python3 "bench/$b.py") >> "$L/ab_$b.txt" 2>&1
                    echo "rc=$?" >> "$L/ab_$b.txt"
                elif [ -f "$v/libmojo_train_cuda_identical.so" ]; then
                    echo "== round $round $(basename "$v")" >> "$L/ab_$b.txt"
                    MOJO_TRAIN_LIBRARY_PATH=$PWD/$v timeout 200 python3 "bench/$b.py" >> "$L/ab_$b.txt" 2>&1
                    echo "rc=$?" >> "$L/ab_$b.txt"
                fi
            done
        done ;;
    abenv=*)
        spec=${step#abenv=}
        b=${spec%%:*}
        sets=$(echo "${spec#*:}" | tr , ' ')
        for round in 1 2 3; do
            echo "== round $round tree" >> "$L/abenv_$b.txt"
            timeout 200 python3 "bench/$b.py" >> "$L/abenv_$b.txt" 2>&1
            echo "rc=$?" >> "$L/abenv_$b.txt"
            echo "== round $round ${spec#*:}" >> "$L/abenv_$b.txt"
            env $sets timeout 200 python3 "bench/$b.py" >> "$L/abenv_$b.txt" 2>&1
            echo "rc=$?" >> "$L/abenv_$b.txt"
        done ;;
    lib=*)
        d=${step#lib=}
        case $d in -) ;; /*) ;; *) d=$PWD/$d ;; esac
        if [ "$d" = - ]; then unset MOJO_TRAIN_LIBRARY_PATH; SUF=; else export MOJO_TRAIN_LIBRARY_PATH=$d; SUF=_$(basename "$d"); fi ;;
    ftz_probe)
        native/build/ftz_probe_cuda > "$L/ftz_probe.json" 2> "$L/ftz_probe.txt"
        echo "rc=$?" >> "$L/ftz_probe.txt" ;;
    unguarded_sweep)
        for m in identical identical_ftz; do
            timeout 120 native/build/unguarded_sweep_cuda_$m; echo "rc=$?"
        done > "$L/unguarded_sweep.txt" 2>&1 ;;
    sanitize)
        make sanitize-cuda > "$L/sanitize.txt" 2>&1
        echo "rc=$?" >> "$L/sanitize.txt"
        cp bench/results/sanitize-cuda.md "$L/" ;;
    *)
        echo "unknown step $step" >> "$L/steps.txt" ;;
    esac
    echo "$step done $(date +%T)" >> "$L/steps.txt"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
