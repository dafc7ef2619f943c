"""The fixed-order kernel: q . x (or |q - x|^2) for every query and row, each sum in one order whatever the queries.

Each (query, row) output is summed over the dimension in increasing order, one float32 (or float64) multiply and one
add a term (l2: a subtract, a multiply, an add), starting from zero: no fused multiply-add, no reassociation, so the
bits are the IEEE rounding of that one sequence, whoever else is searched and whichever path computes it. The work is
vectorised across rows: a tile of VL rows is transposed in registers into a small buffer (dim x VL, in L1/L2), and the
queries run over it in blocks of 8, 4 and 1, each query's value broadcast and multiplied into VL rows at once. One
query reads each row once (as fast as a matrix-vector product, memory-bound); many reuse the tile from cache.

The kernel is LLVM IR written here and compiled once per process by llvmlite (numba's code generator): numba's own
loops left it scalar (numba keeps LLVM's SLP vectorizer off), and its transposes went through scatters, 2.3 ms for
c_fc's rows against 0.4 ms for FAISS's one-query scan (docs/faiss.md, "Kernels"). Without fast-math flags LLVM
neither reassociates nor fuses these operations.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

VECS = 4  # vectors of rows a tile holds (4 x 8 rows in float32, 4 x 4 in float64)
BLOCKS = ((8, 1), (4, 2), (2, 4), (1, 4))  # (queries, row vectors) a pass takes, most queries first: 8 accumulators
LANES = {np.dtype(np.float32): 8, np.dtype(np.float64): 4}  # a 256-bit vector
TILE_ROWS = {dtype: VECS * lanes for dtype, lanes in LANES.items()}
_IR_TYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_LOCK = threading.Lock()
_COMPILED: dict = {}  # (dtype, metric) -> ctypes function; the engine and target machine below keep them alive


def _shuffles(vl: int) -> list[tuple[str, str, list[int]]]:
    """An in-register vl x vl transpose: (output, (a, b), mask) steps from rows r0.. to columns c0.."""
    if vl == 4:
        steps = [
            (f"t{i}", (f"r{2 * (i // 2)}", f"r{2 * (i // 2) + 1}"), [0, 4, 2, 6] if i % 2 == 0 else [1, 5, 3, 7])
            for i in range(4)
        ]
        steps += [("c0", ("t0", "t2"), [0, 1, 4, 5]), ("c2", ("t0", "t2"), [2, 3, 6, 7])]
        return steps + [("c1", ("t1", "t3"), [0, 1, 4, 5]), ("c3", ("t1", "t3"), [2, 3, 6, 7])]
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    steps = [(f"t{i}", (f"r{2 * (i // 2)}", f"r{2 * (i // 2) + 1}"), lo if i % 2 == 0 else hi) for i in range(8)]
    a, b = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    for g in (0, 4):  # u(g+0..3): columns (0,4), (1,5), (2,6), (3,7) of rows g..g+3
        steps += [(f"u{g}", (f"t{g}", f"t{g + 2}"), a), (f"u{g + 1}", (f"t{g}", f"t{g + 2}"), b)]
        steps += [(f"u{g + 2}", (f"t{g + 1}", f"t{g + 3}"), a), (f"u{g + 3}", (f"t{g + 1}", f"t{g + 3}"), b)]
    for k in range(4):
        steps += [(f"c{k}", (f"u{k}", f"u{k + 4}"), [0, 1, 2, 3, 8, 9, 10, 11])]
        steps += [(f"c{k + 4}", (f"u{k}", f"u{k + 4}"), [4, 5, 6, 7, 12, 13, 14, 15])]
    return steps


def _transpose_ir(t: str, vl: int) -> str:
    """@transpose(x, ld, dim, buf): buf[d * vl + i] = x[i * ld + d] for the tile's vl rows."""
    body, tail = _transpose_body(t, vl)
    return f"""
define internal void @transpose(ptr noalias %x, i64 %ld, i64 %dim, ptr noalias %buf, i64 %wd) {{
entry:
  %dv = and i64 %dim, {-vl}
  %any = icmp sgt i64 %dv, 0
  br i1 %any, label %vec, label %tailcheck
vec:
  %d = phi i64 [0, %entry], [%dn, %vec]
{chr(10).join(body)}
  %dn = add i64 %d, {vl}
  %more = icmp slt i64 %dn, %dv
  br i1 %more, label %vec, label %tailcheck
tailcheck:
  %e = phi i64 [%dv, %entry], [%dv, %vec], [%en, %tail]
  %left = icmp slt i64 %e, %dim
  br i1 %left, label %tail, label %done
tail:
  %eb = mul i64 %e, %wd
{chr(10).join(tail)}
  %en = add i64 %e, 1
  br label %tailcheck
done:
  ret void
}}
"""


def _transpose_body(t: str, vl: int) -> tuple[list[str], list[str]]:
    """The vector loop's lines (vl rows loaded, transposed, stored) and the scalar tail's (dimensions past the last
    whole vl)."""
    v, size = f"<{vl} x {t}>", 4 if t == "float" else 8
    body = [f"  %x{i} = mul i64 %ld, {i}\n  %o{i} = add i64 %x{i}, %d" for i in range(vl)]
    body += [
        f"  %p{i} = getelementptr {t}, ptr %x, i64 %o{i}\n  %r{i} = load {v}, ptr %p{i}, align {size}"
        for i in range(vl)
    ]
    for out, (a, b), mask in _shuffles(vl):
        body.append(
            f"  %{out} = shufflevector {v} %{a}, {v} %{b}, <{vl} x i32> <{', '.join(f'i32 {m}' for m in mask)}>"
        )
    for k in range(vl):
        body.append(f"  %w{k} = add i64 %d, {k}\n  %s{k} = mul i64 %w{k}, %wd")
        body.append(f"  %q{k} = getelementptr {t}, ptr %buf, i64 %s{k}\n  store {v} %c{k}, ptr %q{k}, align {size}")
    tail = [
        f"  %y{i} = mul i64 %ld, {i}\n  %z{i} = add i64 %y{i}, %e\n  %a{i} = getelementptr {t}, ptr %x, i64 %z{i}"
        f"\n  %l{i} = load {t}, ptr %a{i}\n  %f{i} = add i64 %eb, {i}\n  %g{i} = getelementptr {t}, ptr %buf, i64 %f{i}"
        f"\n  store {t} %l{i}, ptr %g{i}"
        for i in range(vl)
    ]
    return body, tail


def _block_ir(t: str, vl: int, queries: int, vecs: int, metric: str) -> str:
    """@b{queries}x{vecs}(buf, wd, dim, q, ldq, out, ldo): out[j * ldo + i] = the sum over d, in increasing order, of
    query j's term with the tile's row i (buf[d * wd + i]), for `queries` queries and vecs * vl rows: independent
    accumulators, so one query's adds do not wait on each other."""
    v, size, name = f"<{vl} x {t}>", 4 if t == "float" else 8, f"b{queries}x{vecs}"
    pairs = [(j, r) for j in range(queries) for r in range(vecs)]
    phis = [f"  %acc{j}_{r} = phi {v} [zeroinitializer, %entry], [%next{j}_{r}, %loop]" for j, r in pairs]
    body = ["  %bo = mul i64 %d, %wd"]
    for r in range(vecs):
        body.append(f"  %bi{r} = add i64 %bo, {r * vl}\n  %bp{r} = getelementptr {t}, ptr %buf, i64 %bi{r}")
        body.append(f"  %b{r} = load {v}, ptr %bp{r}, align {size}")
    for j in range(queries):
        body.append(f"  %qo{j} = mul i64 %ldq, {j}\n  %qi{j} = add i64 %qo{j}, %d")
        body.append(f"  %qp{j} = getelementptr {t}, ptr %q, i64 %qi{j}\n  %qs{j} = load {t}, ptr %qp{j}")
        body.append(f"  %qv{j} = insertelement {v} poison, {t} %qs{j}, i64 0")
        body.append(f"  %qb{j} = shufflevector {v} %qv{j}, {v} poison, <{vl} x i32> zeroinitializer")
    body += _terms(t, vl, pairs, metric)
    stores = [
        f"  %oo{j}_{r} = mul i64 %ldo, {j}\n  %oa{j}_{r} = add i64 %oo{j}_{r}, {r * vl}"
        f"\n  %op{j}_{r} = getelementptr {t}, ptr %out, i64 %oa{j}_{r}\n  store {v} %next{j}_{r}, ptr %op{j}_{r}, align {size}"
        for j, r in pairs
    ]
    return _block_function(name, phis, body, stores)


def _terms(t: str, vl: int, pairs, metric: str) -> list[str]:
    """Each (query, row vector) pair's term at d and its add: ip q * x; l2 (q - x) * (q - x)."""
    v, body = f"<{vl} x {t}>", []
    for j, r in pairs:
        if metric == "ip":
            body.append(f"  %term{j}_{r} = fmul {v} %qb{j}, %b{r}")
        else:
            body.append(
                f"  %diff{j}_{r} = fsub {v} %qb{j}, %b{r}\n  %term{j}_{r} = fmul {v} %diff{j}_{r}, %diff{j}_{r}"
            )
        body.append(f"  %next{j}_{r} = fadd {v} %acc{j}_{r}, %term{j}_{r}")
    return body


def _block_function(name: str, phis: list[str], body: list[str], stores: list[str]) -> str:
    return f"""
define internal void @{name}(ptr noalias %buf, i64 %wd, i64 %dim, ptr noalias %q, i64 %ldq, ptr noalias %out, i64 %ldo) {{
entry:
  br label %loop
loop:
  %d = phi i64 [0, %entry], [%dn, %loop]
{chr(10).join(phis)}
{chr(10).join(body)}
  %dn = add i64 %d, 1
  %more = icmp slt i64 %dn, %dim
  br i1 %more, label %loop, label %done
done:
{chr(10).join(stores)}
  ret void
}}
"""


def _driver_ir(t: str, vl: int) -> str:
    """@scan(x, ld, tiles, dim, q, m, ldq, out, ldo, buf): every tile of VECS * vl rows from x (transposed into buf),
    then every query over it in blocks (BLOCKS: queries, row vectors), each block's calls over the tile's vectors."""
    wd, loops, prev = VECS * vl, [], "tile"
    for n, vecs in BLOCKS:
        loops.append(_query_loop(t, vl, n, vecs, prev))
        prev = n
    transposes = [
        f"  %xs{s} = mul i64 %ld, {s * vl}\n  %xq{s} = getelementptr {t}, ptr %xp, i64 %xs{s}"
        f"\n  %bs{s} = getelementptr {t}, ptr %buf, i64 {s * vl}"
        f"\n  call void @transpose(ptr %xq{s}, i64 %ld, i64 %dim, ptr %bs{s}, i64 {wd})"
        for s in range(VECS)
    ]
    return f"""
define void @scan(ptr %x, i64 %ld, i64 %tiles, i64 %dim, ptr %q, i64 %m, i64 %ldq, ptr %out, i64 %ldo, ptr %buf) {{
entry:
  %none = icmp sle i64 %tiles, 0
  br i1 %none, label %done, label %tile
tile:
  %k = phi i64 [0, %entry], [%kn, %x{BLOCKS[-1][0]}]
  %col = mul i64 %k, {wd}
  %xo = mul i64 %col, %ld
  %xp = getelementptr {t}, ptr %x, i64 %xo
{chr(10).join(transposes)}
  br label %transposed
transposed:
{"".join(loops)}
  %kn = add i64 %k, 1
  %more = icmp slt i64 %kn, %tiles
  br i1 %more, label %tile, label %done
done:
  ret void
}}
"""


def _query_loop(t: str, vl: int, n: int, vecs: int, prev) -> str:
    """The tile's queries n at a time, from where the loop for `prev` stopped (prev "tile": from 0)."""
    wd = VECS * vl
    calls = []
    for g in range(0, VECS, vecs):
        calls.append(
            f"  %bg{n}_{g} = getelementptr {t}, ptr %buf, i64 {g * vl}\n  %og{n}_{g} = getelementptr {t}, ptr %op{n}, i64 {g * vl}"
            f"\n  call void @b{n}x{vecs}(ptr %bg{n}_{g}, i64 {wd}, i64 %dim, ptr %qp{n}, i64 %ldq, ptr %og{n}_{g}, i64 %ldo)"
        )
    return f"""
  br label %h{n}
h{n}:
  %j{n} = phi i64 [{"0" if prev == "tile" else f"%j{prev}"}, %{"transposed" if prev == "tile" else f"x{prev}"}], [%jn{n}, %b{n}]
  %end{n} = add i64 %j{n}, {n}
  %fits{n} = icmp sle i64 %end{n}, %m
  br i1 %fits{n}, label %b{n}, label %x{n}
b{n}:
  %qo{n} = mul i64 %j{n}, %ldq
  %qp{n} = getelementptr {t}, ptr %q, i64 %qo{n}
  %oo{n} = mul i64 %j{n}, %ldo
  %oa{n} = add i64 %oo{n}, %col
  %op{n} = getelementptr {t}, ptr %out, i64 %oa{n}
{chr(10).join(calls)}
  %jn{n} = add i64 %j{n}, {n}
  br label %h{n}
x{n}:"""


def _compile(dtype: np.dtype, metric: str):
    import llvmlite.binding as llvm

    t, vl = _IR_TYPE[dtype], LANES[dtype]
    ir = _transpose_ir(t, vl) + "".join(_block_ir(t, vl, n, r, metric) for n, r in BLOCKS) + _driver_ir(t, vl)
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    machine = target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3
    )
    module = llvm.parse_assembly(ir)
    module.verify()
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    scan = ctypes.CFUNCTYPE(None, ptr, i64, i64, i64, ptr, i64, i64, ptr, i64, ptr)(engine.get_function_address("scan"))
    return scan, engine, machine, module


def _scan(dtype: np.dtype, metric: str):
    key = (dtype, metric)
    if key not in _COMPILED:
        with _LOCK:
            if key not in _COMPILED:
                _COMPILED[key] = _compile(dtype, metric)
    return _COMPILED[key][0]


def rows(q: np.ndarray, x: np.ndarray, metric: str, out: np.ndarray | None = None, start: int = 0, stop=None):
    """Every query of q [m, dim] against rows start..stop of x [n, dim] (both x's dtype, C order): q . x, or |q - x|^2
    for l2, into out[:, start:stop] (out [m, n], made if None). Each output's bits are its own query and row's alone."""
    stop = len(x) if stop is None else stop
    m, dim = q.shape
    out = np.empty((m, len(x)), x.dtype) if out is None else out
    vl, width = LANES[x.dtype] * VECS, stop - start
    if m == 0 or width <= 0:
        return out
    if dim == 0:
        out[:, start:stop] = 0
        return out
    q = np.ascontiguousarray(q, x.dtype)
    scan, buf, whole = _scan(x.dtype, metric), np.empty(dim * vl, x.dtype), width // vl
    if whole:
        here = out[:, start:]
        scan(
            x[start:].ctypes.data,
            dim,
            whole,
            dim,
            q.ctypes.data,
            m,
            dim,
            here.ctypes.data,
            out.shape[1],
            buf.ctypes.data,
        )
    if width % vl:  # the last rows, padded with zero rows to a tile
        last, part = np.zeros((vl, dim), x.dtype), np.empty((m, vl), x.dtype)
        last[: width % vl] = x[start + whole * vl : stop]
        scan(last.ctypes.data, dim, 1, dim, q.ctypes.data, m, dim, part.ctypes.data, vl, buf.ctypes.data)
        out[:, start + whole * vl : stop] = part[:, : width % vl]
    return out
