"""The fixed-order kernel: q . x (or |q - x|^2) for every query and row, each sum in one order whatever the queries.

Each (query, row) output is summed over the dimension in increasing order, one float32 (or float64) multiply and one
add a term (l2: a subtract, a multiply, an add), starting from zero: no fused multiply-add, no reassociation, so the
bits are the IEEE rounding of that one sequence, whoever else is searched and whichever path computes it. The work is
vectorised across rows, each query's value broadcast and multiplied into a vector of rows at once. Up to DIRECT_UP_TO
queries read a tile's rows in place (@direct: 8 rows x 8 floats transposed in registers a step, the next tile
prefetched into L2): as fast as FAISS's one-query scan, memory-bound. More transpose each tile once into a small
buffer (dim x tile rows, in L1/L2) and run over it in blocks of 8, 4, 2 and 1 (@scan), reusing it from cache.

The kernel is LLVM IR written here and compiled once per process by llvmlite (numba's code generator): numba's own
loops left it scalar (numba keeps LLVM's SLP vectorizer off), and its transposes went through scatters, 2.3 ms for
c_fc's rows against 0.4 ms for FAISS's one-query scan (docs/faiss.md, "Kernels"). Without fast-math flags LLVM
neither reassociates nor fuses these operations.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import threading

import numpy as np

VECS = 4  # vectors of rows a tile holds (4 x 8 rows in float32, 4 x 4 in float64)
BLOCKS = ((8, 1), (4, 2), (2, 4), (1, 4))  # (queries, row vectors) a pass takes, most queries first: 8 accumulators
LANES = {np.dtype(np.float32): 8, np.dtype(np.float64): 4}  # a 256-bit vector
TILE_ROWS = {dtype: VECS * lanes for dtype, lanes in LANES.items()}
_IR_TYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
L1_WAYS = 8  # an L1 data cache's ways (64 sets of 64 bytes): x86 cores since Skylake and Zen
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
    wd, calls = VECS * vl, []
    for g in range(0, VECS, vecs):
        calls.append(
            f"  %bg{n}_{g} = getelementptr {t}, ptr %buf, i64 {g * vl}\n  %og{n}_{g} = getelementptr {t}, ptr %op{n}, i64 {g * vl}"
            f"\n  call void @b{n}x{vecs}(ptr %bg{n}_{g}, i64 {wd}, i64 %dim, ptr %qp{n}, i64 %ldq, ptr %og{n}_{g}, i64 %ldo)"
        )
    start, came = ("0", "transposed") if prev == "tile" else (f"%j{prev}", f"x{prev}")
    return _queries_by(t, n, start, came, "\n".join(calls))


def _queries_by(t: str, n: int, start: str, came: str, calls: str) -> str:
    """A loop over a tile's queries n at a time from `start` (reached from block `came`): each step's query and
    output pointers (%qp{n}, %op{n}), then `calls`; it leaves by block x{n} once fewer than n queries are left."""
    return f"""
  br label %h{n}
h{n}:
  %j{n} = phi i64 [{start}, %{came}], [%jn{n}, %b{n}]
  %end{n} = add i64 %j{n}, {n}
  %fits{n} = icmp sle i64 %end{n}, %m
  br i1 %fits{n}, label %b{n}, label %x{n}
b{n}:
  %qo{n} = mul i64 %j{n}, %ldq
  %qp{n} = getelementptr {t}, ptr %q, i64 %qo{n}
  %oo{n} = mul i64 %j{n}, %ldo
  %oa{n} = add i64 %oo{n}, %col
  %op{n} = getelementptr {t}, ptr %out, i64 %oa{n}
{calls}
  %jn{n} = add i64 %j{n}, {n}
  br label %h{n}
x{n}:"""


DIRECT_BLOCKS = (2, 1)  # queries a pass of the direct kernel takes (VECS row vectors each): 8 accumulators at most
DIRECT_UP_TO = 3  # query counts the direct kernel computes (no buffer: each tile read for every query block)


def _columns_ir(t: str, vl: int, g: int) -> list[str]:
    """Row vector g's vl rows at d..d+vl-1 as vl vectors %c{g}_{k}: lane i row i's element d + k. Each row's two
    halves are loaded into the low 128 bits beside row i + vl/2's in the high (one load and an insert), then the
    halves are transposed within their 128-bit lanes (vl = 8: a 4x4 by unpacks and shuffles; vl = 4: one unpack)."""
    h, lines = vl // 2, []
    for r in range(vl):  # t{r}: rows r % h and r % h + h at d + (r // h) * h
        row, off = r % h, (r // h) * h
        for side, rr in (("l", row), ("h", row + h)):
            lines.append(
                f"  %o{g}_{r}{side} = add i64 %rb{g}_{rr}, {off}\n  %p{g}_{r}{side} = getelementptr {t}, ptr %x, i64 %o{g}_{r}{side}"
                f"\n  %v{g}_{r}{side} = load <{h} x {t}>, ptr %p{g}_{r}{side}, align 4"
            )
        mask = ", ".join(f"i32 {i}" for i in range(vl))
        lines.append(
            f"  %t{g}_{r} = shufflevector <{h} x {t}> %v{g}_{r}l, <{h} x {t}> %v{g}_{r}h, <{vl} x i32> <{mask}>"
        )
    v = f"<{vl} x {t}>"

    def shuf(out, a, b, m):
        return f"  %{out} = shufflevector {v} %{a}, {v} %{b}, <{vl} x i32> <{', '.join(f'i32 {i}' for i in m)}>"

    if vl == 4:
        for s in (0, 2):
            lines.append(shuf(f"c{g}_{s}", f"t{g}_{s}", f"t{g}_{s + 1}", [0, 4, 2, 6]))
            lines.append(shuf(f"c{g}_{s + 1}", f"t{g}_{s}", f"t{g}_{s + 1}", [1, 5, 3, 7]))
        return lines
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    a, b = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    for s in (0, 4):
        lines.append(shuf(f"u{g}_{s}", f"t{g}_{s}", f"t{g}_{s + 1}", lo))
        lines.append(shuf(f"u{g}_{s + 1}", f"t{g}_{s}", f"t{g}_{s + 1}", hi))
        lines.append(shuf(f"u{g}_{s + 2}", f"t{g}_{s + 2}", f"t{g}_{s + 3}", lo))
        lines.append(shuf(f"u{g}_{s + 3}", f"t{g}_{s + 2}", f"t{g}_{s + 3}", hi))
        lines.append(shuf(f"c{g}_{s}", f"u{g}_{s}", f"u{g}_{s + 2}", a))
        lines.append(shuf(f"c{g}_{s + 1}", f"u{g}_{s}", f"u{g}_{s + 2}", b))
        lines.append(shuf(f"c{g}_{s + 2}", f"u{g}_{s + 1}", f"u{g}_{s + 3}", a))
        lines.append(shuf(f"c{g}_{s + 3}", f"u{g}_{s + 1}", f"u{g}_{s + 3}", b))
    return lines


def _direct_ir(t: str, vl: int, queries: int, metric: str) -> str:
    """@d{queries}(x, ld, dim, q, ldq, out, ldo): out[j * ldo + i] for `queries` queries and the VECS * vl rows of x,
    each the sum over d in increasing order of its term, the rows read and transposed in registers (no buffer)."""
    v = f"<{vl} x {t}>"
    accs = [(j, g) for j in range(queries) for g in range(VECS)]
    offsets = [f"  %gr{g} = mul i64 %gs, {g}\n  %go{g} = mul i64 %gr{g}, %ld" for g in range(VECS)]
    offsets += [
        f"  %rr{g}_{r} = mul i64 %ld, {r}\n  %rm{g}_{r} = add i64 %go{g}, %rr{g}_{r}"
        for g in range(VECS)
        for r in range(vl)
    ]
    body = [f"  %rb{g}_{r} = add i64 %rm{g}_{r}, %d" for g in range(VECS) for r in range(vl)]
    body += _prefetch_ir(t, vl)
    for g in range(VECS):
        body += _columns_ir(t, vl, g)
    for j in range(queries):
        body.append(f"  %qo{j} = mul i64 %ldq, {j}\n  %qd{j} = add i64 %qo{j}, %d")
        for k in range(vl):
            body.append(_broadcast(t, vl, f"{j}_{k}", f"%qd{j}", k))
    for k in range(vl):
        for j, g in accs:
            prev = f"%acc{j}_{g}" if k == 0 else f"%a{j}_{g}_{k - 1}"
            body += _term(t, vl, metric, f"{j}_{g}_{k}", f"%qb{j}_{k}", f"%c{g}_{k}", prev, f"%a{j}_{g}_{k}")
    tail = [f"  %qt{j} = mul i64 %ldq, {j}\n  %qe{j} = add i64 %qt{j}, %e" for j in range(queries)]
    tail += [_broadcast(t, vl, f"t{j}", f"%qe{j}", 0) for j in range(queries)]
    for g in range(VECS):
        col = "poison"
        for r in range(vl):
            tail.append(
                f"  %eo{g}_{r} = add i64 %rm{g}_{r}, %e\n  %ep{g}_{r} = getelementptr {t}, ptr %x, i64 %eo{g}_{r}"
                f"\n  %es{g}_{r} = load {t}, ptr %ep{g}_{r}\n  %ec{g}_{r} = insertelement {v} {col}, {t} %es{g}_{r}, i64 {r}"
            )
            col = f"%ec{g}_{r}"
        for j in range(queries):
            tail += _term(t, vl, metric, f"t{j}_{g}", f"%qbt{j}", col, f"%tacc{j}_{g}", f"%tn{j}_{g}")
    return _direct_function(t, vl, queries, accs, offsets, body, tail)


def _prefetch_ir(t: str, vl: int) -> list[str]:
    """Prefetches of the next tile (%nt), each row vector's vl rows as one run of memory, a step's share (vl * vl
    elements) at each d. The tile's rows are read side by side, VECS * vl streams a few kilobytes each, too short
    for the hardware's prefetcher to follow; the next tile's are fetched (into L2) while this one is computed."""
    size, lines = 4 if t == "float" else 8, [f"  %nd = mul i64 %d, {vl}"]
    for g in range(VECS):
        lines.append(f"  %nb{g} = add i64 %go{g}, %nd")
        for i in range(vl * vl * size // 64):
            lines.append(
                f"  %nf{g}_{i} = add i64 %nb{g}, {i * 64 // size}\n  %np{g}_{i} = getelementptr {t}, ptr %nt, i64 %nf{g}_{i}"
                f"\n  call void @llvm.prefetch.p0(ptr %np{g}_{i}, i32 0, i32 2, i32 1)"
            )
    return lines


def _broadcast(t: str, vl: int, name: str, index: str, k: int) -> str:
    """%qb{name}: q[index + k] in every lane."""
    v = f"<{vl} x {t}>"
    return (
        f"  %qi{name} = add i64 {index}, {k}\n  %qp{name} = getelementptr {t}, ptr %q, i64 %qi{name}"
        f"\n  %qs{name} = load {t}, ptr %qp{name}\n  %qv{name} = insertelement {v} poison, {t} %qs{name}, i64 0"
        f"\n  %qb{name} = shufflevector {v} %qv{name}, {v} poison, <{vl} x i32> zeroinitializer"
    )


def _term(t: str, vl: int, metric: str, name: str, q: str, x: str, acc: str, out: str) -> list[str]:
    """out = acc + (q * x), or acc + (q - x) * (q - x) for l2: one rounding an operation."""
    v = f"<{vl} x {t}>"
    if metric == "ip":
        return [f"  %m{name} = fmul {v} {q}, {x}\n  {out} = fadd {v} {acc}, %m{name}"]
    return [
        f"  %s{name} = fsub {v} {q}, {x}\n  %m{name} = fmul {v} %s{name}, %s{name}\n  {out} = fadd {v} {acc}, %m{name}"
    ]


def _direct_function(t, vl, queries, accs, offsets, body, tail) -> str:
    v, size, last = f"<{vl} x {t}>", 4 if t == "float" else 8, vl - 1
    phis = [f"  %acc{j}_{g} = phi {v} [zeroinitializer, %entry], [%a{j}_{g}_{last}, %vec]" for j, g in accs]
    tphis = [f"  %t{p[3:]}, [%tn{j}_{g}, %tail]" for p, (j, g) in zip(phis, accs)]  # %tacc: %acc's and the tail's
    stores = [
        f"  %so{j}_{g} = mul i64 %ldo, {j}\n  %sa{j}_{g} = add i64 %so{j}_{g}, %gr{g}"
        f"\n  %sp{j}_{g} = getelementptr {t}, ptr %out, i64 %sa{j}_{g}\n  store {v} %tacc{j}_{g}, ptr %sp{j}_{g}, align {size}"
        for j, g in accs
    ]
    n = "\n"
    return f"""
define internal void @d{queries}(ptr noalias %x, i64 %ld, i64 %dim, ptr noalias %q, i64 %ldq, ptr noalias %out, i64 %ldo, i64 %gs, ptr %nt) {{
entry:
{n.join(offsets)}
  %dv = and i64 %dim, {-vl}
  %any = icmp sgt i64 %dv, 0
  br i1 %any, label %vec, label %tailcheck
vec:
  %d = phi i64 [0, %entry], [%dn, %vec]
{n.join(phis)}
{n.join(body)}
  %dn = add i64 %d, {vl}
  %more = icmp slt i64 %dn, %dv
  br i1 %more, label %vec, label %tailcheck
tailcheck:
  %e = phi i64 [%dv, %entry], [%dv, %vec], [%en, %tail]
{n.join(tphis)}
  %left = icmp slt i64 %e, %dim
  br i1 %left, label %tail, label %done
tail:
{n.join(tail)}
  %en = add i64 %e, 1
  br label %tailcheck
done:
{n.join(stores)}
  ret void
}}
"""


def _direct_query_loop(t: str, n: int, prev) -> str:
    """The tile's queries n at a time, from where the loop for `prev` stopped (None: from 0)."""
    start, came = ("0", "tile") if prev is None else (f"%j{prev}", f"x{prev}")
    call = (
        f"  call void @d{n}(ptr %xp, i64 %ld, i64 %dim, ptr %qp{n}, i64 %ldq, ptr %op{n}, i64 %ldo, i64 %gs, ptr %nt)"
    )
    return _queries_by(t, n, start, came, call)


def _first_row_ir(vl: int) -> str:
    """@first_row(k, per, band): tile k's first row, `per` tiles a band of `band` rows (VECS row vectors gs apart)."""
    return f"""
define internal i64 @first_row(i64 %k, i64 %per, i64 %band) alwaysinline {{
  %b = udiv i64 %k, %per
  %w = urem i64 %k, %per
  %bo = mul i64 %b, %band
  %wo = mul i64 %w, {vl}
  %r = add i64 %bo, %wo
  ret i64 %r
}}
"""


def _direct_driver_ir(t: str, vl: int) -> str:
    """@direct(x, ld, tiles, dim, q, m, ldq, out, ldo, gs): every tile of VECS * vl rows of x (VECS row vectors gs
    rows apart, gs / vl tiles a band), read in place, for every query in blocks (DIRECT_BLOCKS), a call of @d{n}."""
    loops = [_direct_query_loop(t, n, prev) for n, prev in zip(DIRECT_BLOCKS, (None,) + DIRECT_BLOCKS)]
    return f"""
define void @direct(ptr %x, i64 %ld, i64 %tiles, i64 %dim, ptr %q, i64 %m, i64 %ldq, ptr %out, i64 %ldo, i64 %gs) {{
entry:
  %none = icmp sle i64 %tiles, 0
  %per = udiv i64 %gs, {vl}
  %band = mul i64 %gs, {VECS}
  br i1 %none, label %done, label %tile
tile:
  %k = phi i64 [0, %entry], [%kn, %x{DIRECT_BLOCKS[-1]}]
  %kn = add i64 %k, 1
  %col = call i64 @first_row(i64 %k, i64 %per, i64 %band)
  %xo = mul i64 %col, %ld
  %xp = getelementptr {t}, ptr %x, i64 %xo
  %ncol = call i64 @first_row(i64 %kn, i64 %per, i64 %band)
  %no = mul i64 %ncol, %ld
  %nt = getelementptr {t}, ptr %x, i64 %no
{"".join(loops)}
  %more = icmp slt i64 %kn, %tiles
  br i1 %more, label %tile, label %done
done:
  ret void
}}
"""


def _compile(dtype: np.dtype, metric: str):
    import llvmlite.binding as llvm

    t, vl = _IR_TYPE[dtype], LANES[dtype]
    ir = _transpose_ir(t, vl) + "".join(_block_ir(t, vl, n, r, metric) for n, r in BLOCKS) + _driver_ir(t, vl)
    ir += "".join(_direct_ir(t, vl, n, metric) for n in DIRECT_BLOCKS) + _direct_driver_ir(t, vl)
    ir += "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)\n" + _first_row_ir(vl)
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
    direct = ctypes.CFUNCTYPE(None, ptr, i64, i64, i64, ptr, i64, i64, ptr, i64, i64)(
        engine.get_function_address("direct")
    )
    return scan, direct, engine, machine, module


def _kernels(dtype: np.dtype, metric: str):
    """(the buffered kernel @scan, the direct one @direct) for this dtype and metric, compiled on first use."""
    key = (dtype, metric)
    if key not in _COMPILED:
        with _LOCK:
            if key not in _COMPILED:
                _COMPILED[key] = _compile(dtype, metric)
    return _COMPILED[key][:2]


@functools.cache  # asked at every search of every row: the answer depends on the shape alone
def group_rows(ld: int, size: int, vl: int, width: int) -> int:
    """Rows between the direct kernel's row vectors: vl (a tile's rows side by side) unless the rows' addresses
    share few L1 sets (a row of 3073 float32 is 3 pages and 4 bytes: 32 rows side by side fall in 2 or 3 of its 64
    sets of 8 ways and evict each other between steps); then the first of vl, 2 vl, 4 vl ... that puts no more than
    L1_WAYS rows' lines in one set (a row's step reads up to two), bands of VECS * gs rows fitting the width."""
    gs = vl
    while VECS * gs <= width:
        starts = [(g * gs + r) * ld * size for g in range(VECS) for r in range(vl)]
        sets = collections.Counter(line % 64 for a in starts for line in {a // 64, (a + 63) // 64})
        if max(sets.values()) <= L1_WAYS:
            return gs
        gs *= 2
    return vl


def rows(q: np.ndarray, x: np.ndarray, metric: str, out: np.ndarray | None = None, start: int = 0, stop=None):
    """Every query of q [m, dim] against rows start..stop of x [n, dim] (both x's dtype, C order): q . x, or |q - x|^2
    for l2, into out[:, start:stop] (out [m, n], made if None). Each output's bits are its own query and row's alone:
    up to DIRECT_UP_TO queries read the rows in place, more go through a tile's buffer, with the same sums."""
    stop = len(x) if stop is None else stop
    m, dim = q.shape
    out = np.empty((m, len(x)), x.dtype) if out is None else out
    vl, width = TILE_ROWS[x.dtype], stop - start
    if m == 0 or width <= 0:
        return out
    if dim == 0:
        out[:, start:stop] = 0
        return out
    q, (scan, direct) = np.ascontiguousarray(q, x.dtype), _kernels(x.dtype, metric)
    buf = None if m <= DIRECT_UP_TO else np.empty(dim * vl, x.dtype)

    def run(at, tiles, gs=LANES[x.dtype]):
        rows, into, ldo = (x[at:], out[:, at:], out.shape[1]) if at < stop else (last, part, vl)
        args = (rows.ctypes.data, dim, tiles, dim, q.ctypes.data, m, dim, into.ctypes.data, ldo)
        return direct(*args, gs) if buf is None else scan(*args, buf.ctypes.data)

    gs = group_rows(dim, x.dtype.itemsize, LANES[x.dtype], width) if buf is None else LANES[x.dtype]
    banded = width // (VECS * gs) * VECS * gs  # rows in bands of VECS row vectors gs rows apart
    if banded:
        run(start, banded // vl, gs)
    if (width - banded) // vl:
        run(start + banded, (width - banded) // vl)
    if width % vl:  # the last rows, padded with zero rows to a tile
        last, part = np.zeros((vl, dim), x.dtype), np.empty((m, vl), x.dtype)
        last[: width % vl] = x[stop - width % vl : stop]
        run(stop, 1)
        out[:, stop - width % vl : stop] = part[:, : width % vl]
    return out
