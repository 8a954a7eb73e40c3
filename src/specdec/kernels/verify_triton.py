"""Triton kernel: every tree node's verification decision in one launch.

Imported only when Triton is installed (``pip install specdec-trees[kernels]``);
:mod:`specdec.kernels.verify_fused` builds the inputs, launches
:func:`launch_decisions` and walks the result. The semantics are those of the
registered verifiers ``match``, ``rejection-iid``, ``rejection-wor`` and
``mixed`` (docs/verifiers.md rules 2-5) run with a
:class:`~specdec.rng.CounterRandom`; the tests check that the
kernel's discrete outputs equal theirs.

One program per tree row (node). Program ``r``:

1. *p*: in ``probs`` mode loads the processed row ``p[r]`` and its mass
   ``m0 = sum(p)``; in ``logits`` mode computes ``p`` on the fly from raw
   logits: top-k (keep logits ``>=`` the row's given threshold, the smallest
   logit of process_logits' top-k set),
   temperature and softmax, ``p = exp((l - max) / T) / Z`` (the steps of
   :func:`~specdec.sampling.process_logits` without top-p).
2. *child tests*, in the verifier's order (rejection children first, then
   match children), test ``t`` using the uniform ``U(seed, walk, node, t)``:
   rejection ``u < min(1, P(x) / q(x))``, match ``u < P(x)``. A rejection
   updates the residual: ``P = [P - q]+ / mass`` (mass from one pass over the
   vocabulary) and, without replacement, ``q(x) = 0; q = norm(q)``; a match
   rejection ``P(x) = 0; P = P / (1 - P(x))``. The residual is never stored:
   each pass recomputes it elementwise from ``p``, ``q'`` and the list of
   rejections so far (the same float operations as the torch rules).
3. *bonus* (no child accepted): inverse CDF of the residual with uniform
   ``U(seed, walk, node, #children)``, in float64: one pass stores every
   block's sum, a scan of the block sums finds the total and the block where
   the cumulative sum first exceeds ``u * total``, and that block alone is
   recomputed to find the index.

Output per row: ``[accepted child row or -1, bonus token or -1, draws used,
status bits]``.

Every float32 division is ``tl.div_rn`` (IEEE round-to-nearest, as torch
divides; a plain ``/`` on float32 compiles to an approximate division on NVIDIA
GPUs), and
the kernels are compiled without FMA contraction, so that elementwise values
are the torch rules' own; only the sums over the vocabulary are taken in a
different order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["launch_decisions", "STATUS_NAN", "STATUS_INF", "STATUS_NEGATIVE", "STATUS_MASS", "STATUS_EMPTY"]

STATUS_NAN = 1
"""A value of the row is NaN."""
STATUS_INF = 2
"""A value of the row is +inf (logits) or infinite (probs)."""
STATUS_NEGATIVE = 4
"""probs mode: a negative probability; logits mode: the row is all -inf."""
STATUS_MASS = 8
"""probs mode: the row does not sum to 1 within ``atol``."""
STATUS_EMPTY = 16
"""The bonus residual has no mass (cannot happen for valid rows)."""


@triton.jit
def _philox_uniform(k0, k1, c0, c1, c2, c3):
    """Philox4x32-10 on uint32 scalars, first two words -> float64 in [0, 1)
    (:func:`specdec.rng.counter_uniform`)."""
    m0 = tl.full((), 0xD2511F53, tl.uint32)
    m1 = tl.full((), 0xCD9E8D57, tl.uint32)
    w0 = tl.full((), 0x9E3779B9, tl.uint32)
    w1 = tl.full((), 0xBB67AE85, tl.uint32)
    c0 = c0.to(tl.uint32)
    c1 = c1.to(tl.uint32)
    c2 = c2.to(tl.uint32)
    c3 = tl.full((), c3, tl.uint32)
    k0 = k0.to(tl.uint32)
    k1 = k1.to(tl.uint32)
    for _ in tl.static_range(10):
        p0_lo = c0 * m0
        p0_hi = tl.umulhi(c0, m0)
        p1_lo = c2 * m1
        p1_hi = tl.umulhi(c2, m1)
        n0 = p1_hi ^ c1 ^ k0
        n2 = p0_hi ^ c3 ^ k1
        c0 = n0
        c1 = p1_lo
        c2 = n2
        c3 = p0_lo
        k0 = k0 + w0
        k1 = k1 + w1
    hi = (c0 >> 5).to(tl.float64)
    lo = (c1 >> 6).to(tl.float64)
    return (hi * 67108864.0 + lo) * (1.0 / 9007199254740992.0)


@triton.jit
def _div(a, b, CD: tl.constexpr):
    """``a / b`` rounded to nearest like torch: ``tl.div_rn`` in float32 (a plain
    ``/`` is an approximate division there), ``/`` in float64 (already exact)."""
    if CD == tl.float64:
        out = a / b
    else:
        out = tl.div_rn(a, b)
    return out


@triton.jit
def _residual(p, q, offs, m0, n_ops, ops_i, ops_f, CD: tl.constexpr):
    """Residual ``P`` and draft law ``q`` after the first ``n_ops`` rejections
    recorded in the workspace, elementwise: the float operations of
    :mod:`specdec.verify.residual` (``p`` and ``q`` may be blocks or scalars)."""
    P = _div(p, m0, CD)
    for j in range(0, n_ops):
        kind = tl.load(ops_i + 3 * j)
        xj = tl.load(ops_i + 3 * j + 1)
        mj = tl.load(ops_f + 2 * j).to(CD)
        if kind == 1:  # rejection (rules 3/4): [P - q]+ / mass
            t = tl.maximum(P - q, 0.0)
        else:  # match (rule 2): P(x) = 0, / mass
            t = tl.where(offs == xj, 0.0, P)
        if mj > 0:  # mass 0: the branch had probability 0; the residual is kept
            P = _div(t, mj, CD)
        if tl.load(ops_i + 3 * j + 2) != 0:  # without replacement (rule 4): q(x) = 0; q = norm(q)
            q = _div(tl.where(offs == xj, 0.0, q), tl.load(ops_f + 2 * j + 1).to(CD), CD)
    return P, q


@triton.jit
def _residual_block(x_row, q_row, offs, mask, law_b, mx, z, kth, temperature, m0, n_ops, ops_i, ops_f,
                    use_logits, HAS_LAW: tl.constexpr, CD: tl.constexpr):
    """``(P, q)`` on the vocabulary block ``offs``: ``p`` loaded (probs) or
    computed from the logits (``exp((l - max) / T) / Z`` on the top-k set), the
    law ``q'`` loaded, then the first ``n_ops`` recorded rejections applied (``use_logits``:
    the row's mode, 1 logits, 0 probs)."""
    if use_logits != 0:
        lg = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        e = tl.exp(tl.div_rn(lg - mx, temperature))
        pv = tl.where(mask & (lg >= kth), tl.div_rn(e, z), 0.0).to(CD)
    else:
        pv = tl.load(x_row + offs, mask=mask, other=0.0).to(CD)
    if HAS_LAW:
        qv = tl.load(q_row + offs, mask=mask & (law_b >= 0), other=0.0).to(CD)
    else:
        qv = tl.zeros(offs.shape, CD)
    if n_ops > 0:
        P, q = _residual(pv, qv, offs, m0, n_ops, ops_i, ops_f, CD)
    else:
        P = _div(pv, m0, CD)
        q = qv
    return P, q


@triton.jit
def _fused_verify_kernel(
    x_ptr,
    x_stride,
    kth_ptr,
    temp_ptr,
    mode_ptr,
    q_ptr,
    q_stride,
    law_ptr,
    tok_ptr,
    crow_ptr,
    nchild_ptr,
    nrej_ptr,
    wor_ptr,
    unif_ptr,
    ws_i_ptr,
    ws_f_ptr,
    bsum_ptr,
    out_ptr,
    V,
    atol,
    LOGITS: tl.constexpr,
    HAS_LAW: tl.constexpr,
    CMAX: tl.constexpr,
    BLOCK: tl.constexpr,
    F64: tl.constexpr,
):
    if F64:
        CD: tl.constexpr = tl.float64
    else:
        # Triton needs the constexpr annotation in each branch; mypy sees a redefinition
        CD: tl.constexpr = tl.float32  # type: ignore[no-redef]
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * x_stride
    arange = tl.arange(0, BLOCK)
    offs_c = tl.arange(0, CMAX)
    nc = tl.load(nchild_ptr + row)
    nrej = tl.load(nrej_ptr + row)
    wor = tl.load(wor_ptr + row)
    law = tl.load(law_ptr + row)
    # (block-shaped: Triton's interpreter rejects a mask made from a scalar bool)
    law_b = arange * 0 + law
    q_row = q_ptr + tl.maximum(law, 0).to(tl.int64) * q_stride
    # the row's uniforms: draw t is U(seed, walk, node, t), t = 0..nc (_uniform_kernel)
    unif = unif_ptr + row.to(tl.int64) * CMAX
    # per-row workspace: the rejections so far, (kind, token, remove) and (mass, q mass)
    ops_i = ws_i_ptr + row.to(tl.int64) * (3 * CMAX)
    ops_f = ws_f_ptr + row.to(tl.int64) * (2 * CMAX)
    status = tl.zeros((), tl.int32)

    # ---------------------------------------------------------------- 1. p
    # Bad values are counted per block in one sum: NaN + 8192 inf + 8192**2 negative
    # (BLOCK <= 4096, so the fields cannot overflow into each other).
    # the row's mode (LOGITS: the launch has rows in logits mode; each row's own mode,
    # temperature and top-k threshold are loaded: one launch serves rows of any configurations)
    mx = tl.zeros((), tl.float32)
    z = tl.full((), 1.0, tl.float32)
    kth = tl.full((), float("-inf"), tl.float32)
    temperature = tl.full((), 1.0, tl.float32)
    use_logits = tl.zeros((), tl.int32)
    m0 = tl.full((), 1.0, CD)
    if LOGITS:
        use_logits = tl.load(mode_ptr + row).to(tl.int32)
        temperature = tl.load(temp_ptr + row).to(tl.float32)
        kth = tl.load(kth_ptr + row).to(tl.float32)
    if use_logits != 0:
        run_max = tl.full((), float("-inf"), tl.float32)
        run_sum = tl.zeros((), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + arange
            mask = offs < V
            lg = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
            bad = tl.sum((lg != lg).to(tl.int64) + 8192 * (lg == float("inf")).to(tl.int64), axis=0)
            if bad % 8192 > 0:
                status |= 1
            if bad >= 8192:
                status |= 2
            # online softmax over the top-k set (logits >= the k-th largest)
            lk = tl.where(mask & (lg >= kth), lg, float("-inf"))
            new_max = tl.maximum(run_max, tl.max(lk, axis=0))
            if new_max > float("-inf"):
                scale = tl.exp(tl.div_rn(run_max - new_max, temperature))
                e = tl.where(lk > float("-inf"), tl.exp(tl.div_rn(lk - new_max, temperature)), 0.0)
                run_sum = run_sum * scale + tl.sum(e, axis=0)
                run_max = new_max
        if run_max == float("-inf"):
            status |= 4
        mx = run_max
        z = run_sum
        m0 = tl.full((), 1.0, CD)
    else:
        acc = tl.zeros((), CD)
        for start in range(0, V, BLOCK):
            offs = start + arange
            mask = offs < V
            pv = tl.load(x_row + offs, mask=mask, other=0.0).to(CD)
            bad = (pv != pv).to(tl.int64) + 8192 * (tl.abs(pv) == float("inf")).to(tl.int64)
            bad = tl.sum(bad + 67108864 * (pv < 0).to(tl.int64), axis=0)
            if bad % 8192 > 0:
                status |= 1
            if (bad // 8192) % 8192 > 0:
                status |= 2
            if bad >= 67108864:
                status |= 4
            acc += tl.sum(pv, axis=0)
        if tl.abs(acc - 1.0) > atol:
            status |= 8
        m0 = acc

    # ------------------------------------------------------ 2. child tests
    accepted = tl.full((), -1, tl.int32)
    draws = nc + 1
    for c in range(0, nc):
        if accepted < 0:
            x = tl.load(tok_ptr + row * CMAX + c)
            if use_logits != 0:
                lx = tl.load(x_row + x).to(tl.float32)
                px = tl.where(lx >= kth, tl.div_rn(tl.exp(tl.div_rn(lx - mx, temperature)), z), 0.0).to(CD)
            else:
                px = tl.load(x_row + x).to(CD)
            if HAS_LAW:
                qx = tl.load(q_row + x, mask=law >= 0, other=0.0).to(CD)
            else:
                qx = tl.zeros((), CD)
            if c > 0:
                Px, qx = _residual(px, qx, x, m0, c, ops_i, ops_f, CD)
            else:
                Px = _div(px, m0, CD)
            u = tl.load(unif + c)
            tl.store(ops_i + 3 * c + 1, x)
            tl.store(ops_i + 3 * c + 2, 0)
            if c < nrej:
                # rules 3/4 (the sampled part of rule 5): accept with min(1, P(x) / q(x))
                prob = tl.minimum(_div(Px, qx, CD), 1.0)
                if u < prob.to(tl.float64):
                    accepted = tl.load(crow_ptr + row * CMAX + c)
                    draws = c + 1
                else:
                    m = tl.zeros((), CD)
                    qn = tl.zeros((), CD)
                    for start in range(0, V, BLOCK):
                        offs = start + arange
                        mask = offs < V
                        P, q = _residual_block(x_row, q_row, offs, mask, law_b, mx, z, kth, temperature, m0, c, ops_i,
                                               ops_f, use_logits, HAS_LAW, CD)
                        m += tl.sum(tl.where(mask, tl.maximum(P - q, 0.0), 0.0), axis=0)
                        qn += tl.sum(tl.where(mask & (offs != x), q, 0.0), axis=0)
                    tl.store(ops_i + 3 * c, 1)
                    tl.store(ops_f + 2 * c, m.to(tl.float64))
                    tl.store(ops_f + 2 * c + 1, qn.to(tl.float64))
                    if (wor != 0) & (c < nrej - 1) & (qn > 0):
                        tl.store(ops_i + 3 * c + 2, 1)
            else:
                # rule 2 (the deterministic part of rule 5): accept with P(x)
                if u < Px.to(tl.float64):
                    accepted = tl.load(crow_ptr + row * CMAX + c)
                    draws = c + 1
                else:
                    tl.store(ops_i + 3 * c, 2)
                    tl.store(ops_f + 2 * c, (1.0 - Px).to(tl.float64))
            tl.debug_barrier()  # the rejection recorded above is read back by every thread

    # ------------------------------------------------------------ 3. bonus
    # Inverse CDF of the residual in float64, one pass over the vocabulary:
    # pass A stores each block's sum (the last value of its cumulative sum);
    # a scan of the block sums gives the total and then the block where the
    # cumulative sum first exceeds u * total (both scans add the same numbers
    # in the same order, so that block exists unless u * total rounded up to
    # total); only that block is recomputed to find the index. If rounding
    # leaves the crossing past the block's own sum, its last positive index is
    # taken; if u * total rounded up to total, the last positive index of the
    # row (pass C, a second full pass that essentially never runs).
    bonus = tl.full((), -1, tl.int32)
    if accepted < 0:
        u = tl.load(unif + nc)
        num_blocks = tl.cdiv(V, BLOCK)
        sums = bsum_ptr + row.to(tl.int64) * num_blocks
        for start in range(0, V, BLOCK):
            offs = start + arange
            mask = offs < V
            P, q = _residual_block(x_row, q_row, offs, mask, law_b, mx, z, kth, temperature, m0, nc, ops_i,
                                   ops_f, use_logits, HAS_LAW, CD)
            vals = tl.where(mask, tl.maximum(P, 0.0), 0.0).to(tl.float64)
            tl.store(sums + start // BLOCK, tl.max(tl.cumsum(vals, axis=0), axis=0))
        tl.debug_barrier()  # the block sums written above are read back by every thread
        total = tl.zeros((), tl.float64)
        for b0 in range(0, num_blocks, BLOCK):
            bidx = b0 + arange
            total = tl.max(total + tl.cumsum(tl.load(sums + bidx, mask=bidx < num_blocks, other=0.0), axis=0), axis=0)
        if total > 0:
            target = u * total
            running = tl.zeros((), tl.float64)
            prev = tl.zeros((), tl.float64)
            block = tl.full((), -1, tl.int32)
            for b0 in range(0, num_blocks, BLOCK):
                if block < 0:
                    bidx = b0 + arange
                    cum = running + tl.cumsum(tl.load(sums + bidx, mask=bidx < num_blocks, other=0.0), axis=0)
                    end = tl.max(cum, axis=0)
                    if end > target:
                        block = tl.min(tl.where(cum > target, bidx, 2147483647), axis=0)
                        prev = tl.max(tl.where(bidx < block, cum, running), axis=0)
                    running = end
            if block >= 0:
                offs = block * BLOCK + arange
                mask = offs < V
                P, q = _residual_block(x_row, q_row, offs, mask, law_b, mx, z, kth, temperature, m0, nc, ops_i,
                                       ops_f, use_logits, HAS_LAW, CD)
                vals = tl.where(mask, tl.maximum(P, 0.0), 0.0).to(tl.float64)
                cdf = prev + tl.cumsum(vals, axis=0)
                if tl.max(cdf, axis=0) > target:
                    bonus = tl.min(tl.where(cdf > target, offs, 2147483647), axis=0)
                else:
                    bonus = tl.max(tl.where(vals > 0, offs, -1), axis=0)
            else:  # pass C
                for start in range(0, V, BLOCK):
                    offs = start + arange
                    mask = offs < V
                    P, q = _residual_block(x_row, q_row, offs, mask, law_b, mx, z, kth, temperature, m0, nc, ops_i,
                                           ops_f, use_logits, HAS_LAW, CD)
                    bonus = tl.maximum(bonus, tl.max(tl.where(mask & (P > 0), offs, -1), axis=0))
        else:
            status |= 16
    tl.store(out_ptr + row * 4 + 0, accepted)
    tl.store(out_ptr + row * 4 + 1, bonus)
    tl.store(out_ptr + row * 4 + 2, draws)
    tl.store(out_ptr + row * 4 + 3, status)


def launch_decisions(
    x: torch.Tensor,
    *,
    logits: bool | torch.Tensor,
    temperature: float | torch.Tensor,
    kth: torch.Tensor | None,
    q_dense: torch.Tensor | None,
    law_row: torch.Tensor,
    child_tokens: torch.Tensor,
    child_rows: torch.Tensor,
    num_children: torch.Tensor,
    num_rejection: torch.Tensor,
    without_replacement: torch.Tensor,
    walk: torch.Tensor,
    node: torch.Tensor,
    seed: int,
    atol: float,
    block: int,
    keys: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch :func:`_fused_verify_kernel` over the ``R`` rows of ``x``.

    Args:
        x: ``[R, V]`` processed probabilities (``logits=False``) or raw logits,
            unit stride along ``V``.
        logits: the mode (see the module docstring): True for every row in ``logits`` mode,
            False for every row in ``probs`` mode, or ``[R]`` bool each row's own mode (a batch of
            rows under their own configurations, one launch).
        temperature: ``> 0``, or ``[R]`` float32 each row's; used in ``logits`` mode.
        kth: ``[R]`` float32 top-k thresholds (``-inf``: no top-k); ``logits`` mode.
        q_dense: ``[L, V]`` dense proposal laws ``q'`` in the compute dtype, or None.
        law_row: ``[R]`` int32 row of ``q_dense`` for each row's rejection
            children, ``-1`` for none.
        child_tokens, child_rows: ``[R, CMAX]`` int32 tokens and rows of the
            children in test order (rejection children first); ``CMAX`` is a
            power of two larger than every row's number of children (the
            row's bonus is draw ``#children``).
        num_children, num_rejection, without_replacement: ``[R]`` int32.
        walk, node: ``[R]`` int32 key words of each row's uniforms.
        seed: the 64-bit key.
        atol: tolerance on ``sum(p) = 1`` (probs mode).
        block: vocabulary block (power of two).
        keys: ``[R, 2]`` int64 per-row key words ``(k0, k1)`` (a batch of rows
            with their own seeds, :meth:`~specdec.rng.RowStreams.counter_keys`);
            None: every row is keyed by ``seed``.

    Returns:
        ``[R, 4]`` int32 (see the module docstring).
    """
    rows, vocab = x.shape
    cmax = child_tokens.shape[1]
    f64 = x.dtype == torch.float64
    out = torch.empty((rows, 4), dtype=torch.int32, device=x.device)
    if rows == 0:
        return out
    has_law = q_dense is not None
    q = q_dense if q_dense is not None else x  # dummy pointer, never read
    kth_t = kth if kth is not None else law_row  # dummy pointer, never read in probs mode
    if isinstance(logits, torch.Tensor):
        mode = logits.to(device=x.device, dtype=torch.int32).contiguous()
        any_logits = True
    else:
        mode = torch.full((rows,), int(bool(logits)), dtype=torch.int32, device=x.device)
        any_logits = bool(logits)
    temp = (temperature.to(device=x.device, dtype=torch.float32).contiguous() if isinstance(temperature, torch.Tensor)
            else torch.full((rows,), float(temperature), dtype=torch.float32, device=x.device))
    _fused_verify_kernel[(rows,)](
        x,
        x.stride(0),
        kth_t,
        temp,
        mode,
        q,
        q.stride(0),
        law_row,
        child_tokens,
        child_rows,
        num_children,
        num_rejection,
        without_replacement,
        uniform_table(seed, walk, node, cmax, keys=keys),
        torch.zeros(rows * cmax * 3, dtype=torch.int32, device=x.device),
        torch.zeros(rows * cmax * 2, dtype=torch.float64, device=x.device),
        torch.empty(rows * triton.cdiv(vocab, block), dtype=torch.float64, device=x.device),
        out,
        vocab,
        float(atol),
        LOGITS=any_logits,
        HAS_LAW=has_law,
        CMAX=cmax,
        BLOCK=block,
        F64=f64,
        num_warps=4 if block <= 1024 else 8,
        enable_fp_fusion=False,  # no a*b+c contraction: the same roundings as torch's separate ops
    )
    return out


UNIFORM_BLOCK = 1024


def uniform_table(seed: int, walk: torch.Tensor, node: torch.Tensor, width: int,
                  keys: torch.Tensor | None = None) -> torch.Tensor:
    """``[R, width]`` float64 table ``U(seed, walk[r], node[r], t)`` for ``t < width``:
    every uniform the rows' rules may draw, in one vectorised launch. With
    ``keys`` (``[R, 2]`` int64 words), row ``r`` is keyed by ``keys[r]`` instead of ``seed``."""
    rows = walk.shape[0]
    out = torch.empty((rows, width), dtype=torch.float64, device=walk.device)
    total = rows * width
    if total:
        grid = (triton.cdiv(total, UNIFORM_BLOCK),)
        row_keys = keys is not None
        _uniform_kernel[grid](walk, node, walk, keys.contiguous() if keys is not None else walk,
                              0 if row_keys else seed & 0xFFFFFFFF, 0 if row_keys else (seed >> 32) & 0xFFFFFFFF,
                              out, total, TABLE=True, ROW_KEYS=row_keys, WIDTH=width, BLOCK=UNIFORM_BLOCK,
                              enable_fp_fusion=False)
    return out


def launch_uniforms(seed: int, walk: torch.Tensor, node: torch.Tensor, draw: torch.Tensor) -> torch.Tensor:
    """``U(seed, walk[i], node[i], draw[i])`` for ``[N]`` int32 key tensors, as
    float64 (the kernel's Philox, exposed for the bit-equality tests)."""
    total = walk.shape[0]
    out = torch.empty(total, dtype=torch.float64, device=walk.device)
    if total:
        grid = (triton.cdiv(total, UNIFORM_BLOCK),)
        _uniform_kernel[grid](walk, node, draw, walk, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, out, total,
                              TABLE=False, ROW_KEYS=False, WIDTH=1, BLOCK=UNIFORM_BLOCK, enable_fp_fusion=False)
    return out


@triton.jit(do_not_specialize=["k0_in", "k1_in"])
def _uniform_kernel(walk_ptr, node_ptr, draw_ptr, key_ptr, k0_in, k1_in, out_ptr, total,
                    TABLE: tl.constexpr, ROW_KEYS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < total
    if TABLE:
        r = idx // WIDTH
        draw = idx % WIDTH
    else:
        r = idx
        draw = tl.load(draw_ptr + idx, mask=mask, other=0)
    walk = tl.load(walk_ptr + r, mask=mask, other=0)
    node = tl.load(node_ptr + r, mask=mask, other=0)
    if ROW_KEYS:  # every row its own stream (a batch of rows, each keyed by its own seed)
        k0 = tl.load(key_ptr + 2 * r, mask=mask, other=0)
        k1 = tl.load(key_ptr + 2 * r + 1, mask=mask, other=0)
        u = _philox_uniform(k0, k1, draw, node, walk, 0x5EC0DEC0)
    else:
        u = _philox_uniform(k0_in, k1_in, draw, node, walk, 0x5EC0DEC0)
    tl.store(out_ptr + idx, u, mask=mask)
