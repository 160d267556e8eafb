#!/usr/bin/python3
# tests/tools/equiv_numpy_check.py - an independent cross-check of examples/equiv (not run by ctest; needs
# Debian's python3-numpy and python3-yaml): runs each file's local-view plan per rank and its `spec:` on one
# device in NumPy (float64, random normal inputs, seed 0), assembles the plan's outputs by their placements on
# the file's one mesh axis, and compares. A file expecting value-mismatch must differ, any other must agree.
# Only the ops the examples use; RoPE is rotate-half with theta 10000; FlashAttention is bshd, non-causal.
#   /usr/bin/python3 tests/tools/equiv_numpy_check.py examples/equiv/*.yaml
import sys, math, itertools, re, yaml, numpy as np

def ev(expr, env, real=False):
    if isinstance(expr, (int, float)): return expr
    s = re.sub(r'axis_index\((\w+)\)', r'__ai_\1', str(expr))
    if not real: s = s.replace('/', '//')
    return eval(s, {"sqrt": math.sqrt}, env)

def rope(x, pos, theta=10000.0):
    D = x.shape[-1]; half = D // 2
    inv = theta ** (-np.arange(half) * 2.0 / D)
    ang = np.asarray(pos, dtype=float)[:, None] * inv[None, :]      # [S, half]
    ang = ang[:, None, :]                                            # [S, 1, half] for [.., S, H, D]
    c = np.concatenate([np.cos(ang)] * 2, -1); s = np.concatenate([np.sin(ang)] * 2, -1)
    rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * c + rot * s

def softmax(x, d):
    m = x.max(axis=d, keepdims=True); e = np.exp(x - m); return e / e.sum(axis=d, keepdims=True)

def attn_bshd(q, k, v):
    s = np.einsum('bshd,bthd->bhst', q, k) / math.sqrt(q.shape[-1])
    return np.einsum('bhst,bthd->bshd', softmax(s, -1), v)

def gelu(x): return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))

def run(ops, env0, envs, nranks, mesh):
    """envs: per-rank dict of values; collectives act across ranks. Returns envs."""
    for op in ops:
        k = op['op']; ins = op.get('in', []); ins = [ins] if isinstance(ins, str) else ins
        outs = op.get('out'); outs = [outs] if isinstance(outs, str) else outs
        if k in ('AllReduce', 'AllGather', 'AllToAll', 'RingRotate'):
            vals = [e[ins[0]] for e in envs]
            if k == 'AllReduce':
                t = sum(vals); t = t / nranks if op.get('reduce') == 'avg' else t
                res = [t.copy() for _ in vals]
            elif k == 'AllGather':
                t = np.concatenate(vals, op['dim']); res = [t.copy() for _ in vals]
            elif k == 'RingRotate':
                res = [vals[(r - 1) % nranks] for r in range(nranks)]
            else:
                sd, cd = op['split_dim'], op['concat_dim']
                parts = [np.split(v, nranks, sd) for v in vals]
                res = [np.concatenate([parts[i][j] for i in range(nranks)], cd) for j in range(nranks)]
            for e, r in zip(envs, res): e[outs[0]] = r
            continue
        for r, e in enumerate(envs):
            env = dict(env0); env.update({f'__ai_{a}': (r if nranks > 1 else 0) for a in mesh})
            X = [e[i] for i in ins]
            sc = ev(op['scalar'], env, True) if 'scalar' in op else None
            if k in ('Add', 'Sub', 'Multiply', 'Div', 'Minimum', 'Maximum'):
                b = X[1] if len(X) > 1 else sc
                f = {'Add': np.add, 'Sub': np.subtract, 'Multiply': np.multiply, 'Div': np.divide, 'Minimum': np.minimum, 'Maximum': np.maximum}[k]
                y = f(X[0], b)
            elif k == 'Sum': y = X[0].sum(axis=tuple(op['dims']), keepdims=op.get('keepdim', False))
            elif k == 'LogSumExp':
                d = tuple(op['dims']); m = X[0].max(axis=d, keepdims=True)
                y = m + np.log(np.exp(X[0] - m).sum(axis=d, keepdims=True))
                if not op.get('keepdim', False): y = y.squeeze(d)
            elif k == 'Transpose': y = np.swapaxes(X[0], *op['dims'])
            elif k == 'Reshape': y = X[0].reshape([ev(s, env) for s in op['shape']])
            elif k == 'Expand': y = np.broadcast_to(X[0], [ev(s, env) for s in op['shape']]).copy()
            elif k == 'MatMul': y = np.matmul(X[0], X[1])
            elif k == 'Arange': y = np.arange(ev(op.get('start', 0), env), ev(op['end'], env)).astype(float)
            elif k == 'RoPE': y = rope(X[0], X[1])
            elif k == 'Pad':
                w = [(0, 0)] * X[0].ndim; w[op['dim']] = (ev(op.get('before', 0), env), ev(op.get('after', 0), env)); y = np.pad(X[0], w)
            elif k == 'Slice':
                sl = [slice(None)] * X[0].ndim; sl[op['dim']] = slice(ev(op.get('start', 0), env), ev(op['end'], env)); y = X[0][tuple(sl)]
            elif k == 'Split':
                ys = np.split(X[0], len(outs), op['dim'])
                for o, v in zip(outs, ys): e[o] = v
                continue
            elif k == 'Concat': y = np.concatenate(X, op['dim'])
            elif k == 'GELU': y = gelu(X[0])
            elif k == 'Softmax': y = softmax(X[0], op.get('dim', -1))
            elif k == 'Exp': y = np.exp(X[0])
            elif k == 'ReLU': y = np.maximum(X[0], 0)
            elif k == 'FlashAttention': y = attn_bshd(*X)
            else: raise SystemExit('no op ' + k)
            e[outs[0]] = y
    return envs

def main(path):
    p = yaml.safe_load(open(path)); mesh = p['mesh']; assert len(mesh) == 1
    env0 = {}
    for k, v in (p.get('sizes') or {}).items(): env0[k] = ev(v, env0)
    mesh = {a: ev(v, env0) for a, v in mesh.items()}
    (ax, n), = mesh.items()
    env0.update(mesh)
    rng = np.random.default_rng(0)
    glob = {}
    for name, t in p['tensors'].items():
        glob[name] = rng.standard_normal([ev(s, env0) for s in t['shape']])
    def local(name, r):
        pl = (p['tensors'][name].get('placement') or {}).get(ax, 'R')
        if pl == 'R': return glob[name].copy()
        d = int(pl[2:-1]); return np.split(glob[name], n, d)[r]
    envs = [{k: local(k, r) for k in glob} for r in range(n)]
    envs = run(p['ops'], env0, envs, n, mesh)
    senv = run(p['spec']['ops'], env0, [dict(glob)], 1, mesh)[0]
    so = p['spec'].get('outputs'); pairs = {o: o for o in so} if isinstance(so, list) else so
    ok = True
    for o, decl in p['outputs'].items():
        pl = ((decl or {}).get('placement') or {}).get(ax, 'R')
        if pl == 'R': got = envs[0][o]
        else: got = np.concatenate([e[o] for e in envs], int(pl[2:-1]))
        want = senv[pairs[o]]
        same = got.shape == want.shape and np.allclose(got, want, rtol=1e-9, atol=1e-12)
        ok &= same
        print(f'  {o}: {"equal" if same else "DIFFERENT"} {got.shape} vs {want.shape}')
    return ok

bad = 0
for f in sys.argv[1:]:
    print(f.split('/')[-1]); eq = main(f)
    want_eq = 'value-mismatch' not in open(f).read().split('\nexpect:')[-1]
    bad += eq != want_eq
    print('  ->', 'OK' if eq == want_eq else 'WRONG VERDICT')
print(f'{len(sys.argv) - 1 - bad} of {len(sys.argv) - 1} as expected')
sys.exit(1 if bad else 0)
