# V4.1 Engram n-gram hashing in numpy (model-spec §4.5), the same function as
# src/model/engram_hash.cpp: compressed-token map from tokenizer.json, primes, numpy-PCG64
# multipliers, and the table rows of every position of a batch.
import numpy as np


def compressed_token_map(tokenizer_path):
    """Class of every token id (HF41 build_compressed_token_map): decode the id alone; text
    holding U+FFFD keys by the raw token string, else by the normalized text."""
    from tokenizers import Regex, Tokenizer, normalizers
    tok = Tokenizer.from_file(tokenizer_path)
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), "\ue000"),
        normalizers.Strip(), normalizers.Replace("\ue000", " ")])
    n = tok.get_vocab_size(with_added_tokens=True)
    keys, cls = {}, np.zeros(n, dtype=np.int64)
    for i in range(n):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = norm.normalize_str(text) or text
        cls[i] = keys.setdefault(key, len(keys))
    return cls, len(keys)


def _is_prime(v):
    if v < 2:
        return False
    if v % 2 == 0:
        return v == 2
    d = 3
    while d * d <= v:
        if v % d == 0:
            return False
        d += 2
    return True


class EngramHash:
    def __init__(self, tc, tokenizer_path):
        """tc: the text_config dict."""
        self.cls, n_cls = compressed_token_map(tokenizer_path)
        assert n_cls == tc["engram_compressed_vocab_size"], (n_cls, tc["engram_compressed_vocab_size"])
        self.pad = int(self.cls[tc["engram_pad_token_id"]])
        self.max_ngram, self.heads = tc["engram_max_ngram_size"], tc["engram_n_heads"]
        self.layers = list(tc["engram_layer_ids"])
        seen, self.primes, self.offsets, self.mult = set(), [], [], []
        for li, L in enumerate(self.layers):
            row = []
            for _ in range(self.max_ngram - 1):
                cur = tc["engram_vocab_size"] - 1
                for _ in range(self.heads):
                    c = cur + 1
                    while not _is_prime(c) or c in seen:
                        c += 1
                    cur = c
                    seen.add(c)
                    row.append(c)
            off = np.concatenate([[0], np.cumsum(row)[:-1]]).astype(np.uint64)
            assert sum(row) == tc["engram_num_embeddings"][li], (sum(row), tc["engram_num_embeddings"][li])
            bound = max(1, ((2 ** 63 - 1) // n_cls) // 2)
            r = np.random.default_rng(10007 * L).integers(0, bound, size=self.max_ngram, dtype=np.int64)
            self.primes.append(np.array(row, dtype=np.uint64))
            self.offsets.append(off)
            self.mult.append((r * 2 + 1).astype(np.uint64))

    def rows(self, li, ids):
        """ids [B, T] (every sequence starts at position 0) -> table rows [B, T, cols] int64."""
        ids = np.asarray(ids)
        B, T = ids.shape
        c = self.cls[ids].astype(np.uint64)
        out = np.zeros((B, T, (self.max_ngram - 1) * self.heads), dtype=np.int64)
        mix = None
        for i in range(self.max_ngram):
            ci = np.full((B, T), self.pad, dtype=np.uint64)
            ci[:, i:] = c[:, :T - i] if i else c
            prod = ci * self.mult[li][i]
            mix = prod if i == 0 else mix ^ prod
            if i == 0:
                continue
            for k in range(self.heads):
                j = (i - 1) * self.heads + k
                out[:, :, j] = (mix % self.primes[li][j] + self.offsets[li][j]).astype(np.int64)
        return out
