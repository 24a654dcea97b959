"""Deterministic multilingual test corpus for the tokenizer (seeded; no files needed).

Used by test_tokenizer_hf.py (exactness against HF `tokenizers`) and bench/tokenizer_bench.py.
"""
import random

LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœšžłğışŁŽÀÉÈÇÑÖÜ"
WORDS = ("the quick brown fox jumps over lazy dog naïve café résumé façade jalapeño Zürich Ærøskøbing "
         "São Paulo Kraków Ελληνικά кириллица Москва Україна עברית").split()
CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴切拉"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンガギグゲゴザジズゼゾダヂヅデドバビブベボパピプペポーッャュョ"
HANGUL = "".join(chr(c) for c in range(0xAC00, 0xAC00 + 400, 3))
ARABIC = "ابتثجحخدذرزسشصضطظعغفقكلمنهوي" + "ًٌٍَُِّْ" + "٠١٢٣٤٥٦٧٨٩،؟"
DEVANAGARI = "अआइईउऊएऐओऔकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह" + "ािीुूेैोौंःँ्" + "०१२३४५६७८९।"
THAI = "กขคฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรลวศษสหฬอฮ" + "ะัาำิีึืุูเแโใไ่้๊๋็์" + "๐๑๒๓๔๕๖๗๘๙"
GREEK_CYR = "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΩабвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЯ"
EMOJI = ["😀", "😂", "🥲", "👍", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "❤️", "🇫🇷", "🇯🇵", "🧑‍🤝‍🧑", "✋🏻", "🤷‍♀️",
         "1️⃣", "©️", "🫠", "🐍", "🚀", "☕", "⭐"]
COMBINING = [chr(c) for c in range(0x300, 0x36F)] + ["\u20d7", "\u1dc0", "\ufe20"]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\u00a0", "\u1680", "\u2000", "\u2002", "\u2003",
              "\u2007", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u0085", "\u180e",
              "\u200b", "\u200c", "\u200d", "\ufeff", "\x1c", "\x1f"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["。", "，", "！", "？", "、", "「", "」", "…", "—", "–", "«", "»",
         "¿", "¡", "‘", "’", "“", "”", "€", "£", "¥", "©", "®", "™", "°", "±", "×", "÷", "→", "∑", "∞", "≠", "≤", "√"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹¼½¾", "ⅠⅡⅢⅣ", "๐๑๒"]

CODE = [
 "def {f}({a}, {b}=None):\n    \"\"\"Docstring.\"\"\"\n    if {a} is None:\n        return []\n    return [x ** 2 for x in range({a}) if x % {n} == 0]\n",
 "#include <stdio.h>\nint {f}(int {a}) {{\n\tfor (int i = 0; i < {a}; ++i) {{ printf(\"%d\\n\", i * {n}); }}\n\treturn 0;\n}}\n",
 "const {f} = async ({a}) => {{\n  const res = await fetch(`/api/${{{a}}}?n={n}`);\n  return res.json();\n}};\n",
 "fn {f}({a}: &[u32]) -> Option<u32> {{\n    {a}.iter().copied().filter(|x| *x > {n}).max()\n}}\n",
 "func {f}({a} []int) (int, error) {{\n\tif len({a}) == 0 {{\n\t\treturn 0, errors.New(\"empty\")\n\t}}\n\treturn {a}[0] + {n}, nil\n}}\n",
 "SELECT {a}.id, COUNT(*) AS n FROM {f} {a} WHERE {a}.value >= {n} GROUP BY {a}.id ORDER BY n DESC;\n",
 "<div class=\"{f}\" data-id=\"{n}\">\n  <p>{a} &amp; {b}</p>\n</div>\n",
 "for f in *.{a}; do\n  echo \"$f\" | sed -e 's/{b}/{f}/g' > \"${{f%.{a}}}.out\"  # {n}\ndone\n",
 "{{\"{a}\": [{n}, {n}.5, -1e-7, true, null], \"{b}\": {{\"{f}\": \"\\u00e9\\n\"}}}}\n",
 "    public static void {f}(String[] {a}) throws IOException {{\r\n        System.out.println({a}.length + {n});\r\n    }}\r\n",
]


def _ident(r):
    n = r.randint(1, 12)
    s = "".join(r.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(n))
    return r.choice([s, s.upper(), s.capitalize(), s + str(r.randint(0, 99)), "camel" + s.capitalize()])


def _run(r, alphabet, lo=1, hi=12):
    return "".join(r.choice(alphabet) for _ in range(r.randint(lo, hi)))


def _gen_one(r, kind, specials):
    if kind == "latin":
        return " ".join(r.choice(WORDS) if r.random() < 0.4 else _run(r, LATIN) for _ in range(r.randint(1, 25)))
    if kind == "cjk":
        return "".join(_run(r, CJK, 1, 20) + r.choice(["，", "。", " ", "", "！", "\n", "的", "a", "1"]) for _ in range(r.randint(1, 8)))
    if kind == "kana":
        return "".join(_run(r, KANA + CJK[:80], 1, 15) + r.choice(["。", "、", " ", "", "ー", "!", "2024年"]) for _ in range(r.randint(1, 6)))
    if kind == "hangul":
        return " ".join(_run(r, HANGUL, 1, 8) for _ in range(r.randint(1, 10))) + r.choice([".", "?", "", "!!"])
    if kind == "arabic":
        return " ".join(_run(r, ARABIC, 1, 10) for _ in range(r.randint(1, 10)))
    if kind == "devanagari":
        return " ".join(_run(r, DEVANAGARI, 1, 10) for _ in range(r.randint(1, 10)))
    if kind == "thai":
        return "".join(_run(r, THAI, 1, 20) + r.choice([" ", "", "ๆ"]) for _ in range(r.randint(1, 6)))
    if kind == "greek_cyrillic":
        return " ".join(_run(r, GREEK_CYR, 1, 10) for _ in range(r.randint(1, 10)))
    if kind == "emoji":
        return "".join(r.choice(EMOJI + [" ", "a", "中", "!", "\n", "1"]) for _ in range(r.randint(1, 20)))
    if kind == "combining":
        return "".join(r.choice(LATIN + "aeiou 中あ") + "".join(r.choice(COMBINING) for _ in range(r.randint(0, 4))) for _ in range(r.randint(1, 15)))
    if kind == "code":
        s = r.choice(CODE).format(f=_ident(r), a=_ident(r), b=_ident(r), n=r.randint(0, 10 ** r.randint(1, 9)))
        return s * r.randint(1, 3)
    if kind == "numbers":
        parts = []
        for _ in range(r.randint(1, 10)):
            c = r.random()
            if c < 0.3: parts.append(str(r.randint(0, 10 ** r.randint(1, 30))))
            elif c < 0.5: parts.append(f"{r.uniform(-1e6, 1e6):.{r.randint(0, 8)}f}")
            elif c < 0.6: parts.append(f"{r.uniform(0, 1):e}")
            elif c < 0.8: parts.append(_run(r, r.choice(DIGITS), 1, 12))
            else: parts.append(r.choice(["1,000,000", "3.14159", "v1.2.3", "0x1F", "1e10", "192.168.0.1", "50%", "$9.99", "2024-11-29"]))
        return r.choice([" ", "", ", ", "\n", "+", "-"]).join(parts)
    if kind == "whitespace":
        out = []
        for _ in range(r.randint(1, 12)):
            out.append("".join(r.choice(WHITESPACE) for _ in range(r.randint(1, 6))))
            out.append(r.choice(["", "a", "word", "中文", "1", "!", ".", "x y", "Ωmega"]))
        return "".join(out)
    if kind == "crlf":
        return "\r\n".join(r.choice(["line one", "", "  indented", "\tTab", "end.", "数据", "a\r", "b\n"]) for _ in range(r.randint(1, 10)))
    if kind == "special":
        parts = []
        for _ in range(r.randint(1, 8)):
            parts.append(r.choice(specials))
            parts.append(r.choice(["", "hello", " ", "\n", "你好", "<", "｜", "<｜", "think", "🙂", "123"]))
        return "".join(parts)
    if kind == "long_word":
        c = r.random()
        if c < 0.25: return _run(r, "abcdefghijklmnopqrstuvwxyz", 300, 3000)
        if c < 0.4: return r.choice("ab") * r.randint(300, 3000)
        if c < 0.55: return _run(r, "0123456789", 100, 2000)
        if c < 0.7: return r.choice([" ", "\n", "\t", "=", "-", "\u3000"]) * r.randint(100, 2000)
        if c < 0.85: return _run(r, CJK, 200, 2000)
        return "https://example.com/" + "/".join(_ident(r) for _ in range(r.randint(20, 200)))
    if kind == "punct":
        return "".join(r.choice(PUNCT + [" ", "a", "Z", "\n", "1"]) for _ in range(r.randint(1, 30)))
    if kind == "random_unicode":
        out = []
        for _ in range(r.randint(1, 30)):
            plane = r.random()
            if plane < 0.5: cp = r.randint(0x20, 0x2FFF)
            elif plane < 0.8: cp = r.randint(0x3000, 0xFFFD)
            else: cp = r.randint(0x10000, 0x2FFFF)
            if 0xD800 <= cp <= 0xDFFF: cp = 0x41
            out.append(chr(cp))
        return "".join(out)
    if kind == "mixed":
        return "".join(_gen_one(r, r.choice(KINDS[:-1]), specials) for _ in range(r.randint(2, 5)))
    raise ValueError(kind)


KINDS = ["latin", "cjk", "kana", "hangul", "arabic", "devanagari", "thai", "greek_cyrillic", "emoji", "combining",
         "code", "numbers", "whitespace", "crlf", "special", "long_word", "punct", "random_unicode", "mixed"]


def corpus(n, specials, seed=1234):
    """`n` strings, every kind in turn; `specials` are added-token strings to embed."""
    r = random.Random(seed)
    return [_gen_one(r, KINDS[i % len(KINDS)], specials) for i in range(n)]


def mixed_text(n_bytes, seed=99):
    """About `n_bytes` of mixed text for the benchmark (documents of 1-8 KB)."""
    r = random.Random(seed)
    docs, size = [], 0
    weights = {"latin": 30, "code": 20, "cjk": 10, "kana": 4, "hangul": 3, "arabic": 3, "devanagari": 3, "thai": 2,
               "greek_cyrillic": 4, "emoji": 2, "numbers": 6, "punct": 3, "crlf": 3, "whitespace": 2, "combining": 1}
    kinds = list(weights)
    w = [weights[k] for k in kinds]
    while size < n_bytes:
        doc = "\n".join(_gen_one(r, r.choices(kinds, w)[0], ["<｜end▁of▁sentence｜>"]) for _ in range(r.randint(5, 40)))
        docs.append(doc)
        size += len(doc.encode())
    return docs
