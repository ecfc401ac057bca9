# bench/isa_env.sh: sourced by bench/run_all and bench/train.sh after they set isa_arch, the -march
# the build gave fusebox and Eigen (FUSEBOX_ARCH; `make bench ISA=...`); a variable, since POSIX sh
# passes no arguments to a sourced file (dash kept the caller's $1). It pins the prebuilt peers and the
# JIT to the same vector ISA, so that a comparison at AVX2 on an AVX-512 host is at AVX2 on both
# sides: OpenBLAS's kernel choice (OPENBLAS_CORETYPE), libtorch's own kernels
# (ATEN_CPU_CAPABILITY), oneDNN's, which libtorch's convolutions run on (ONEDNN_MAX_CPU_ISA; its
# older name DNNL_MAX_CPU_ISA too), MKL's, which runs the matrix products of a libtorch built with
# it, as PyTorch's own x86 builds are (MKL_ENABLE_INSTRUCTIONS; ATEN_CPU_CAPABILITY does not reach
# it), and the JIT's generated kernels (FUSEBOX_CXXFLAGS, which come after the JIT's own
# -march=native). A variable the caller set is kept.
isa_arch="${isa_arch:-native}"
case "$isa_arch" in
  native)
    # OpenBLAS 0.3.21 (Debian 12) detects its kernels by CPU model, and on a model it does not know
    # falls back to Prescott's SSE3 kernels: on the GPU host's Xeon that was 28 GFLOP/s against 167
    # with SkylakeX's (docs/benchmarks.md, run AV), which would make the OpenBLAS and libtorch peers
    # look 3-6x slower than they are. So the core follows the CPU's flags, as fusebox's -march does.
    if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
      isa_flags=" $(grep -m1 '^flags' /proc/cpuinfo | sed 's/^[^:]*://') "
      isa_has() { for f in "$@"; do case "$isa_flags" in *" $f "*) ;; *) return 1 ;; esac; done; }
      if isa_has avx512f avx512dq avx512bw avx512vl; then export OPENBLAS_CORETYPE=SkylakeX
      elif isa_has avx2 fma; then export OPENBLAS_CORETYPE=Haswell; fi
    fi ;;
  x86-64-v3 | haswell)
    export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}" ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}"
    export ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX2}" DNNL_MAX_CPU_ISA="${DNNL_MAX_CPU_ISA:-AVX2}"
    export MKL_ENABLE_INSTRUCTIONS="${MKL_ENABLE_INSTRUCTIONS:-AVX2}" ;;
  x86-64-v4 | skylake-avx512)
    export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-SkylakeX}" ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx512}"
    export ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX512_CORE}" DNNL_MAX_CPU_ISA="${DNNL_MAX_CPU_ISA:-AVX512_CORE}"
    export MKL_ENABLE_INSTRUCTIONS="${MKL_ENABLE_INSTRUCTIONS:-AVX512}" ;;
esac
if [ "$isa_arch" != native ]; then export FUSEBOX_CXXFLAGS="-march=$isa_arch${FUSEBOX_CXXFLAGS:+ $FUSEBOX_CXXFLAGS}"; fi
isa_summary="-march=$isa_arch; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-} MKL_ENABLE_INSTRUCTIONS=${MKL_ENABLE_INSTRUCTIONS:-} FUSEBOX_CXXFLAGS=${FUSEBOX_CXXFLAGS:-}"
