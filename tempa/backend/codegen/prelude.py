"""The C++ prelude every kernel file starts with: scalar types, math, and the helpers that
keep loops vectorisable.

Vectorisation is the point of most of what is here. gcc vectorises an ``omp simd`` loop only
when every statement in it has a vector form:

* math functions come from glibc's libmvec (8 floats a call on AVX2). gcc calls a vector
  version when the scalar function is declared ``simd``, but it does not for the functions
  it knows as builtins with an "internal function" form (exp, log, sin, cos, pow, ...):
  under ``-fno-math-errno`` those become internal calls that only a target instruction could
  vectorise, so softmax's ``exp`` stayed a scalar call while ``erf`` was vectorised. We
  declare each libmvec function under a name of our own bound to the libm symbol
  (``asm("expf")``): gcc sees an ordinary ``simd`` function and calls ``_ZGVdN8v_expf``.
  libmvec's documented error bound for these is a few ulp (glibc's libm-test-ulps), far
  inside our 1e-5 tolerance; special values (inf, NaN, underflow) go through the same code
  as the scalar libm (tests/backend/test_cpu_vector_math.py checks them against torch).
* NaN-propagating max/min (``t_max``) are written without ``||``: a short-circuit is a
  branch, and a branch in the loop body stops the vectoriser ("control flow in loop").
* gcc keeps a ``c ? a : b`` whose arms could raise an FP exception as a branch unless
  trapping math is off; the prelude turns it off (``#pragma GCC optimize``) since nothing
  reads the FP exception flags.
* a max/min *reduction* uses an OpenMP user-defined reduction (``tmax``/``tmin``) so the
  row loop can carry ``omp simd``: OpenMP's built-in ``max`` does not propagate NaN.
"""
from __future__ import annotations

import functools

HEADER = r"""
// FP exceptions are never inspected, and with trapping math on gcc will not if-convert a
// select whose unused arm could trap (a masked score, x * 0.25), so such loops stayed scalar.
// Results do not change (unlike -ffast-math): no reassociation, NaN and inf kept.
#pragma GCC optimize("no-trapping-math")
// No #include at all: <cmath> alone costs ~0.7 s of gcc time; the gcc builtins below are
// the same libm calls (or inline instructions) without the header parse.
typedef __INT64_TYPE__ int64_t; typedef __INT32_TYPE__ int32_t; typedef __INT16_TYPE__ int16_t;
typedef __INT8_TYPE__ int8_t; typedef __UINT8_TYPE__ uint8_t;
extern "C" void* aligned_alloc(unsigned long, unsigned long) noexcept;
extern "C" void free(void*) noexcept;
"""

MATH_TAIL = r"""
template <class T> static inline T abs(T x) { return x < 0 ? -x : x; }
static inline float abs(float x) { return __builtin_fabsf(x); }
static inline double abs(double x) { return __builtin_fabs(x); }
template <class T> static inline bool isnan(T x) { return x != x; }
template <class T> static inline T max(T a, T b) { return a < b ? b : a; }
}
"""

HELPERS = r"""
template <class T> struct is_fp { static constexpr bool v = false; };
template <> struct is_fp<float> { static constexpr bool v = true; };
template <> struct is_fp<double> { static constexpr bool v = true; };
// NaN wins (as in eager). Bitwise | on purpose: no branch, so loops stay vectorisable.
template <class T> static inline T t_max(T a, T b) { return ((a != a) | (a > b)) ? a : b; }
template <class T> static inline T t_min(T a, T b) { return ((a != a) | (a < b)) ? a : b; }
static inline bool t_max(bool a, bool b) { return a || b; }
static inline bool t_min(bool a, bool b) { return a && b; }
#pragma omp declare reduction(tmax : float, double : omp_out = t_max(omp_out, omp_in)) initializer(omp_priv = -__builtin_inf())
#pragma omp declare reduction(tmin : float, double : omp_out = t_min(omp_out, omp_in)) initializer(omp_priv = __builtin_inf())
template <class T> static inline T t_floor(T a) { if constexpr (is_fp<T>::v) return m::floor(a); else return a; }
template <class T> static inline T t_ceil(T a) { if constexpr (is_fp<T>::v) return m::ceil(a); else return a; }
template <class T> static inline T t_round(T a) { if constexpr (is_fp<T>::v) return m::nearbyint(a); else return a; }
template <class T> static inline T t_trunc(T a) { if constexpr (is_fp<T>::v) return m::trunc(a); else return a; }
template <class T> static inline T t_sign(T a) { return static_cast<T>((T(0) < a) - (a < T(0))); }
static inline bool t_sign(bool a) { return a; }
template <class T> static inline T t_not(T a) { return ~a; }
static inline bool t_not(bool a) { return !a; }
template <class T> static inline T t_pow(T a, T b) {
  if constexpr (is_fp<T>::v) return m::pow(a, b);
  else { if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
         T r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; } }
template <class T> static inline T t_fmod(T a, T b) { if constexpr (is_fp<T>::v) return m::fmod(a, b); else return a % b; }
template <class T> static inline T t_remainder(T a, T b) {
  if constexpr (is_fp<T>::v) { T r = m::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
  else { T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; } }
static inline float t_copysign(float a, float b) { return __builtin_copysignf(a, b); }
static inline double t_copysign(double a, double b) { return __builtin_copysign(a, b); }
// Floats: ATen's div_floor_floating (c10/util/generic_math.h), i.e. Python's float //, which
// rounds by the exact remainder: floor(1.0 / 0.1) is 10, but 1.0 // 0.1 is 9.
template <class T> static inline T t_floordiv(T a, T b) {
  if constexpr (is_fp<T>::v) {
    if (b == 0) return a / b;
    T mod = m::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    if (div == 0) return t_copysign(T(0), a / b);
    T fl = m::floor(div);
    return (div - fl > T(0.5)) ? fl + T(1) : fl; }
  else { T q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; } }
"""

# The m:: functions. Those with a libmvec version on this system call it (see above); the
# rest are gcc builtins (inline instructions for sqrt/floor/..., libm calls otherwise).
UNARY = ["exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "sin", "cos", "tan",
         "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf", "erfc",
         "lgamma", "floor", "ceil", "trunc", "nearbyint", "fabs"]
BINARY = ["pow", "atan2", "fmod"]

# glibc's libmvec: which functions have vector versions depends on the glibc version.
_MVEC_BASIC = ["exp", "log", "sin", "cos", "pow"]                        # glibc 2.22
_MVEC_FULL = _MVEC_BASIC + ["acos", "acosh", "asin", "asinh", "atan", "atanh", "atan2", "cosh",
                            "erf", "erfc", "exp2", "expm1", "log10", "log1p", "log2", "sinh",
                            "tan", "tanh"]                                # glibc 2.35


@functools.lru_cache(None)
def wide_vectors() -> bool:
    """Whether this CPU has 512-bit vectors (AVX-512F), which ``-march=native`` code may use
    (emit.WIDE_SIMD_MIN says where)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return False


@functools.lru_cache(None)
def mvec_functions() -> tuple:
    """The libm functions with vector versions on this system (empty without libmvec)."""
    try:
        import ctypes
        import ctypes.util
        name = ctypes.util.find_library("mvec")
        if not name:
            return ()
        lib = ctypes.CDLL(name)
    except OSError:
        return ()
    if hasattr(lib, "_ZGVdN8v_tanhf") or hasattr(lib, "_ZGVbN4v_tanhf"):
        return tuple(_MVEC_FULL)
    if hasattr(lib, "_ZGVdN8v_expf") or hasattr(lib, "_ZGVbN4v_expf"):
        return tuple(_MVEC_BASIC)
    return ()


# float erf as fused multiply-adds and one inline exp, both arms computed and one selected
# by bits (no branch, so an omp simd loop vectorises it with no call). Why: libmvec's erff
# cost twice ATen's: an exact GELU over 512x3072 took 1.31 ms against eager's 0.69
# (0.99 now, with 512-bit vectors; benchmarks/README.md, issue 18). The polynomials are
# N. Juffa's; with Cephes' expf inline the maximum error is 1.006 ulp against double erf
# (every 7th float checked); tests/backend/test_cpu_wide_math.py and
# test_cpu_vector_math.py check values and special cases.
ERF_F32 = r"""static inline float erf_exp(float x) {   // exp(x) for x <= 0, Cephes' expf, inline
  x = x > -87.0f ? x : -87.0f;                     // exp(-87) ~ 1.6e-38: 1 - it is 1
  const float n = __builtin_rintf(x * 1.44269504088896341f);
  float f = __builtin_fmaf(n, -0.693359375f, x);
  f = __builtin_fmaf(n, 2.12194440e-4f, f);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, f, 1.3981999507e-3f);
  p = __builtin_fmaf(p, f, 8.3334519073e-3f);
  p = __builtin_fmaf(p, f, 4.1665795894e-2f);
  p = __builtin_fmaf(p, f, 1.6666665459e-1f);
  p = __builtin_fmaf(p, f, 5.0000001201e-1f);
  p = __builtin_fmaf(p, f * f, f) + 1.0f;
  return p * __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
}
static inline float erf(float a) {
  const float t = __builtin_fabsf(a), s = a * a;
  float r = __builtin_fmaf(-1.72853470e-5f, t, 3.83197126e-4f);
  const float u = __builtin_fmaf(-3.88396438e-3f, t, 2.42546219e-2f);
  r = __builtin_fmaf(r, s, u);
  r = __builtin_fmaf(r, t, -1.06777877e-1f);
  r = __builtin_fmaf(r, t, -6.34846687e-1f);
  r = __builtin_fmaf(r, t, -1.28717512e-1f);
  r = __builtin_fmaf(r, t, -t);
  r = __builtin_copysignf(1.0f - erf_exp(r), a);  // |a| > 0.927734375: 1 - exp(poly)
  float q = -5.96761703e-4f;                         // else an odd polynomial
  q = __builtin_fmaf(q, s, 4.99119423e-3f);
  q = __builtin_fmaf(q, s, -2.67681349e-2f);
  q = __builtin_fmaf(q, s, 1.12819925e-1f);
  q = __builtin_fmaf(q, s, -3.76125336e-1f);
  q = __builtin_fmaf(q, s, 1.28379166e-1f);
  q = __builtin_fmaf(q, a, a);
  // select by bits: with ``t > c ? r : q`` gcc sinks the exp into a branch of its own and
  // the loop no longer vectorises ("control flow in loop"). NaN: q, which is NaN.
  const int32_t m = -static_cast<int32_t>(t > 0.927734375f);
  return __builtin_bit_cast(float, (__builtin_bit_cast(int32_t, r) & m) |
                                   (__builtin_bit_cast(int32_t, q) & ~m));
}"""


def _math(vector: tuple) -> str:
    out = []
    for f in UNARY + BINARY:
        n = 2 if f in BINARY else 1
        ps = ", ".join(["float"] * n), ", ".join(["double"] * n)
        args = ", ".join("xy"[:n])
        sig_f = ", ".join(f"float {a}" for a in "xy"[:n])
        sig_d = ", ".join(f"double {a}" for a in "xy"[:n])
        if f in vector:
            # our own name, the libm symbol: gcc sees a plain simd function, not its builtin
            out.append(f'extern "C" float tv_{f}f({ps[0]}) noexcept __asm__("{f}f") '
                       f'__attribute__((simd("notinbranch"), const));')
            out.append(f'extern "C" double tv_{f}({ps[1]}) noexcept __asm__("{f}") '
                       f'__attribute__((simd("notinbranch"), const));')
            fcall, dcall = f"tv_{f}f", f"tv_{f}"
        else:
            fcall, dcall = f"__builtin_{f}f", f"__builtin_{f}"
        if f == "erf":   # float: ERF_F32 below, vectorised through m::exp
            out.append(f"namespace m {{ {ERF_F32}\n"
                       f"static inline double {f}({sig_d}) {{ return {dcall}({args}); }} }}")
            continue
        out.append(f"namespace m {{ static inline float {f}({sig_f}) {{ return {fcall}({args}); }}\n"
                   f"static inline double {f}({sig_d}) {{ return {dcall}({args}); }} }}")
    return "\n".join(out)


@functools.lru_cache(None)
def prelude() -> str:
    return HEADER + _math(mvec_functions()) + "\nnamespace m {" + MATH_TAIL + HELPERS


def reduction_clause(rtype: str, acc: str, floating: bool):
    """The ``omp simd`` reduction clause for a row loop, or None when the loop stays scalar."""
    if rtype == "sum":
        return f"reduction(+:{acc})"
    if rtype == "prod":
        return f"reduction(*:{acc})"
    if rtype in ("max", "min"):   # (bool any/all stay scalar: the caller passes no bool)
        # floats: our NaN-propagating reductions; integers: OpenMP's own (no NaN to carry)
        return f"reduction({'t' if floating else ''}{rtype}:{acc})"
    return None
