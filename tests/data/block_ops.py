# The float64 numpy block math the drafter references share (mtp_reference.py for V4,
# dspark_reference.py for V4.1), written from model-spec §3.3 (mHC mixes, the same in V4.1's
# §4.2) and §3.8 / §4.4 (SwiGLU with its clamps): one Ops per fixture, bound to its dequantized
# weights P and its text config.
import numpy as np


class Ops:
    def __init__(self, P, cfg):
        self.P = P
        self.n, self.eps, self.hc_eps = cfg["hc_mult"], cfg["rms_norm_eps"], cfg["hc_eps"]
        self.iters, self.limit = cfg["hc_sinkhorn_iters"], cfg["swiglu_limit"]

    def rms(self, x, w=None):
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return y if w is None else y * w

    def mixes(self, X, p):  # §3.3 steps 1-5; X [n, D]
        P, n, hc_eps = self.P, self.n, self.hc_eps
        fn, base, scale = P[p + "_fn"], P[p + "_base"], P[p + "_scale"]
        xf = X.reshape(-1)
        m = (fn @ xf) / np.sqrt(np.mean(xf * xf) + self.eps)
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        pre = sig(m[:n] * scale[0] + base[:n]) + hc_eps
        post = 2 * sig(m[n:2 * n] * scale[1] + base[n:2 * n])
        C = (m[2 * n:] * scale[2] + base[2 * n:]).reshape(n, n)
        C = np.exp(C - C.max(-1, keepdims=True))
        C = C / C.sum(-1, keepdims=True) + hc_eps
        C = C / (C.sum(0, keepdims=True) + hc_eps)
        for _ in range(self.iters - 1):
            C = C / (C.sum(-1, keepdims=True) + hc_eps)
            C = C / (C.sum(0, keepdims=True) + hc_eps)
        return pre, post, C

    @staticmethod
    def hc_post(F, X, post, C):  # X'_k = post_k F + sum_j C[j,k] X_j
        return post[:, None] * F[None, :] + C.T @ X

    def swiglu(self, x, w1, w3, w2):
        g = np.minimum(w1 @ x, self.limit)
        u = np.clip(w3 @ x, -self.limit, self.limit)
        return w2 @ (g / (1 + np.exp(-g)) * u)
