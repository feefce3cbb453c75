#!/usr/bin/env python3
"""Writes tests/data/embed_sentences.jsonl, the embedding service's test texts:
one {"text": ...} a line, the same bytes on every run (seeded RNG, word and
phrase lists below, stdlib only).

    python3 scripts/make_embed_sentences.py                    # write the file
    $PY scripts/make_embed_sentences.py --model $MODEL --check  # and its token histogram

The mix is chosen to catch tokenizer and length differences, not to be good
prose: English short, medium and long; Chinese, Japanese, Korean, Russian,
Arabic, Hindi and Greek; emoji (ZWJ sequences, flags, skin tones);
mixed-script lines; numbers, code and URLs; accented Latin (precomposed and
combining forms, ß, ligatures, Turkish İ); whitespace and control
characters; single words and single characters; and about 25 texts of 300 to
600 words (or CJK characters) that run past the 256-token limit. The lines
are shuffled so that a batch of 32 in file order mixes lengths.

--check (needs the `tokenizers` package, scripts/embed_venv.sh) tokenizes
every line as bert_reference.py does (truncation at the model's
max_seq_length, no padding) and prints a histogram of the token counts
before truncation; it exits 1 when fewer than 20 lines exceed 256 tokens.
"""

import argparse
import json
import os
import random
import sys

SEED = 20240607
OUT = "tests/data/embed_sentences.jsonl"

# --- English -----------------------------------------------------------------
SUBJECTS = ["the engineer", "a small dog", "my neighbour", "the committee", "an old sailor",
            "the new scheduler", "a tired student", "the orchestra", "our GPU cluster",
            "the mayor", "a curious child", "the database", "the baker", "two hikers",
            "the compiler", "a stray cat", "the research team", "the train", "her grandmother",
            "the river", "a young pianist", "the storm", "the startup", "the museum guide"]
VERBS = ["repaired", "ignored", "painted", "measured", "described", "carried", "followed",
         "rewrote", "celebrated", "inspected", "borrowed", "photographed", "explained",
         "abandoned", "scheduled", "translated", "cooked", "tested", "sold", "discovered"]
OBJECTS = ["the broken bicycle", "a long letter", "the quarterly report", "a loaf of bread",
           "the wooden bridge", "every failing test", "an ancient map", "the kitchen table",
           "a strange noise", "the benchmark results", "a bowl of soup", "the garden fence",
           "the red umbrella", "a stack of invoices", "the mountain trail", "the violin",
           "a cup of coffee", "the network cable", "a pile of leaves", "the lecture notes"]
PLACES = ["in the morning", "near the harbour", "after lunch", "during the meeting",
          "before sunrise", "on the third floor", "in a hurry", "without a word",
          "under the old oak tree", "at the station", "in the pouring rain", "last Tuesday",
          "behind the library", "with great care", "over the weekend", "in the lab"]
CONNECT = ["because", "although", "while", "so", "and then", "but", "even though", "until"]
ADJ = ["quiet", "enormous", "fragile", "bright", "slow", "unexpected", "careful", "noisy",
       "expensive", "cheerful", "ancient", "efficient", "stubborn", "gentle", "rusty"]
EN_WORDS = ["serendipity", "antidisestablishmentarianism", "tokenizer", "hello", "embedding",
            "pneumonoultramicroscopicsilicovolcanoconiosis", "GPU", "Tuesday", "okay", "zebra"]

# --- other scripts: phrases that combine into sentences -------------------------
ZH = ["今天天气很好。", "我们明天去北京开会。", "这个模型可以把句子变成向量。", "他在图书馆看书。",
      "请把窗户打开。", "机器学习需要大量的数据。", "我喜欢喝绿茶。", "火车晚点了二十分钟。",
      "这家餐厅的饺子非常好吃。", "孩子们在公园里踢足球。", "服务器的内存不够用了。",
      "她正在学习弹钢琴。", "春节的时候大家都回家。", "这座桥已经有一百年的历史。",
      "程序员修复了一个严重的错误。", "山上的雪还没有融化。", "我们需要更快的显卡。",
      "老师在黑板上写了一首诗。", "请问最近的地铁站在哪里？", "这本书讲的是古代的历史。"]
JA = ["今日はとても暑いですね。", "駅の前で友達と会いました。", "このプログラムは速く動きます。",
      "私は毎朝コーヒーを飲みます。", "東京タワーに行ったことがありますか？", "猫が窓のそばで寝ている。",
      "新しいパソコンを買いたいです。", "雨が降りそうなので傘を持っていきます。",
      "日本語の勉強は楽しいです。", "会議は午後三時から始まります。", "桜の花がきれいに咲いた。",
      "このラーメンは本当においしい。", "データベースのバックアップを取りました。",
      "カタカナとひらがなと漢字を使います。", "週末に山へハイキングに行きます。"]
KO = ["오늘 날씨가 정말 좋네요.", "저는 매일 아침 운동을 합니다.", "이 모델은 문장을 벡터로 바꿉니다.",
      "서울은 한국의 수도입니다.", "커피 한 잔 주세요.", "지하철이 곧 도착합니다.",
      "우리는 주말에 바다에 갔어요.", "컴퓨터가 너무 느려요.", "한글은 세종대왕이 만들었습니다.",
      "도서관에서 책을 빌렸어요.", "김치찌개를 좋아하세요?", "회의가 한 시간 늦어졌습니다.",
      "새로운 그래픽 카드가 필요합니다.", "아이들이 운동장에서 놀고 있어요.", "내일 다시 연락드리겠습니다."]
RU = ["Сегодня прекрасная погода.", "Мы поедем в Москву на поезде.", "Эта модель превращает предложения в векторы.",
      "Кошка спит на подоконнике.", "Пожалуйста, закройте дверь.", "Программист исправил ошибку в коде.",
      "Библиотека открывается в девять утра.", "Зимой здесь очень много снега.",
      "Я люблю читать русскую литературу.", "Сервер перезагрузился ночью без предупреждения.",
      "Дети играют в футбол во дворе.", "Вчера мы ходили в театр.", "Чай остыл, пока мы разговаривали.",
      "Графический процессор считает быстрее центрального.", "Река замёрзла в начале декабря.",
      "Бабушка испекла пирог с яблоками.", "Поезд опоздал на полчаса.", "Съешь же ещё этих мягких французских булок."]
AR = ["الطقس جميل اليوم.", "ذهبت إلى المكتبة لقراءة كتاب.", "هذا النموذج يحول الجمل إلى متجهات.",
      "القطة نائمة بجانب النافذة.", "من فضلك أغلق الباب.", "نحن نتعلم اللغة العربية.",
      "المدينة مزدحمة في الصباح.", "شربت فنجان قهوة مع صديقي.", "الحاسوب سريع جدا.",
      "سافرنا إلى القاهرة في الصيف.", "الأطفال يلعبون في الحديقة.", "اجتماع الفريق غدا في العاشرة."]
HI = ["आज मौसम बहुत अच्छा है।", "मैं रोज़ सुबह चाय पीता हूँ।", "यह मॉडल वाक्यों को वेक्टर में बदलता है।",
      "बच्चे पार्क में खेल रहे हैं।", "कृपया दरवाज़ा बंद कर दीजिए।", "दिल्ली भारत की राजधानी है।",
      "ट्रेन आधे घंटे देर से आई।", "हमें तेज़ कंप्यूटर चाहिए।", "मेरी दादी बहुत अच्छा खाना बनाती हैं।",
      "पुस्तकालय सुबह नौ बजे खुलता है।", "बारिश के बाद मिट्टी की खुशबू आती है।"]
EL = ["Ο καιρός είναι υπέροχος σήμερα.", "Πήγαμε στην Αθήνα με το τρένο.", "Αυτό το μοντέλο μετατρέπει προτάσεις σε διανύσματα.",
      "Η γάτα κοιμάται δίπλα στο παράθυρο.", "Παρακαλώ κλείστε την πόρτα.", "Ο προγραμματιστής διόρθωσε το σφάλμα.",
      "Τα παιδιά παίζουν στην αυλή.", "ΟΔΟΣ ΣΤΑΔΙΟΥ ΚΑΙ ΠΑΝΕΠΙΣΤΗΜΙΟΥ.", "Η θάλασσα είναι ήρεμη το πρωί.",
      "Ο Σωκράτης ήταν φιλόσοφος.", "Θέλω ένα φλιτζάνι καφέ, παρακαλώ."]
LATIN = ["Le café est très chaud ce matin.", "Où est la gare, s'il vous plaît ?", "Ça coûte vingt-cinq euros.",
         "Die Straße ist heute geschlossen.", "Grüße aus München und Köln!", "Übermorgen fährt der Zug um 7 Uhr.",
         "El niño comió una manzana en el jardín.", "¿Dónde está la biblioteca?", "Mañana habrá una reunión importante.",
         "A informação está disponível em português.", "Não sei se ele vem hoje.", "O pão de queijo é delicioso.",
         "Tiếng Việt có rất nhiều dấu thanh.", "Tôi thích uống cà phê sữa đá.", "Zażółć gęślą jaźń.",
         "Příliš žluťoučký kůň úpěl ďábelské ódy.", "İstanbul'da hava çok güzel.", "Şu ığdır örneği Türkçe.",
         "Smørrebrød og rødgrød med fløde.", "Þetta er íslenska.", "Åsa åt ärtsoppa på torsdagen.",
         "La déjà-vu est une sensation étrange.", "Crème brûlée, naïve façade, coöperate, résumé.",
         "Ḃ ḟ ṡ with dots above, and ǅ ǈ ǋ digraphs.", "ﬁnancial ﬂow uses ligatures ﬁ ﬂ."]
EMOJI = ["😀", "🚀", "🔥", "👍🏽", "❤️", "🎉", "🤖", "🐍", "🦀", "☕", "🌧️", "🍕", "💾", "🧪", "📈",
         "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇧🇷", "🇺🇦", "✅", "❌", "⚡", "🙈", "🎸", "🏔️", "🌊"]
CODE = ["fn main() { println!(\"hello, world\"); }", "for i in range(10): print(i ** 2)",
        "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id LIMIT 50;",
        "git commit -m \"fix: off-by-one in tokenizer\" && git push origin main",
        "curl -s https://api.example.com/v1/embed?model=all-MiniLM-L6-v2&batch=32 | jq '.data[0]'",
        "let x: Vec<f32> = (0..384).map(|i| i as f32 * 0.5).collect();",
        "https://en.wikipedia.org/wiki/BERT_(language_model)#Architecture",
        "ssh user@192.168.1.42 -p 2222 'df -h /var/lib/data'", "export CUDA_VISIBLE_DEVICES=0,1",
        "if (a[i] >= b[j] && !done) { swap(&a[i], &b[j]); }", "mailto:someone@example.org?subject=Hi%20there",
        "docker run --rm -it -v $(pwd):/work ubuntu:22.04 bash", "{\"key\": [1, 2.5, -3e-7, null, true]}",
        "<div class=\"row\"><span id=\"x-1\">42</span></div>", "C:\\Program Files\\Coexec\\bin\\coexec.exe --help",
        "0x7fff_ffff + 1 == 0x8000_0000", "s/\\bfoo\\b/bar/g", "λx.λy.x y", "∀ε>0 ∃δ>0: |x−a|<δ ⇒ |f(x)−f(a)|<ε"]
NUMBERS = ["The invoice total is $1,234,567.89 due on 2024-12-31.", "Call +1 (555) 010-9999 ext. 42.",
           "π ≈ 3.14159265358979 and e ≈ 2.71828182845905.", "Version 1.32.0 replaced 1.31.1 on 03/04/2025.",
           "Temperature: -40°C = -40°F; humidity 97%.", "ISBN 978-3-16-148410-0, page 12 of 1,024.",
           "12345678901234567890", "3.0e8 m/s × 9.81 m/s² ÷ 2", "Room 101, floor 7, building B-12.",
           "Score: 98.6 ± 0.4 (n = 1,000, p < 0.001)", "1st, 2nd, 3rd and 4th place", "¥5000 / €42 / £17.50 / ₹999"]


def english_sentence(rng):
    s = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(PLACES)}"
    if rng.random() < 0.4:
        s += f" {rng.choice(CONNECT)} {rng.choice(SUBJECTS)} was {rng.choice(ADJ)}"
    return s[0].upper() + s[1:] + rng.choice([".", ".", ".", "!", "?"])


def english(rng, words_min, words_max):
    """Sentences joined until the text has words_min..words_max words."""
    target = rng.randint(words_min, words_max)
    out, n = [], 0
    while n < target:
        s = english_sentence(rng)
        out.append(s)
        n += len(s.split())
    return " ".join(out)


def phrases(rng, pool, k_min, k_max, sep=""):
    return sep.join(rng.choice(pool) for _ in range(rng.randint(k_min, k_max)))


def long_phrases(rng, pool, chars_min, chars_max, sep=""):
    target = rng.randint(chars_min, chars_max)
    out = []
    while len(sep.join(out)) < target:
        out.append(rng.choice(pool))
    return sep.join(out)


def emoji_line(rng):
    base = english_sentence(rng).split()
    for _ in range(rng.randint(2, 6)):
        base.insert(rng.randint(0, len(base)), "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3))))
    return " ".join(base)


def mixed_line(rng):
    pools = [ZH, JA, KO, RU, AR, HI, EL, LATIN]
    parts = [english_sentence(rng)] + [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 3))]
    rng.shuffle(parts)
    return " ".join(parts)


def texts(rng):
    out = []
    add = lambda n, f: out.extend(f() for _ in range(n))
    add(120, lambda: english(rng, 3, 14))                       # English, short
    add(60, lambda: english(rng, 20, 90))                       # English, medium
    add(15, lambda: english(rng, 100, 190))                     # English, 130-250 tokens
    add(15, lambda: english(rng, 300, 600))                     # English, past 256 tokens
    add(30, lambda: phrases(rng, ZH, 1, 4))
    add(3, lambda: long_phrases(rng, ZH, 300, 480))             # CJK: a token per character
    add(25, lambda: phrases(rng, JA, 1, 3))
    add(2, lambda: long_phrases(rng, JA, 320, 460))
    add(25, lambda: phrases(rng, KO, 1, 3, " "))
    add(30, lambda: phrases(rng, RU, 1, 4, " "))
    add(2, lambda: long_phrases(rng, RU, 2000, 3200, " "))      # 300-450 words
    add(20, lambda: phrases(rng, AR, 1, 3, " "))
    add(20, lambda: phrases(rng, HI, 1, 3, " "))
    add(20, lambda: phrases(rng, EL, 1, 3, " "))
    add(1, lambda: long_phrases(rng, EL, 2200, 3000, " "))
    add(30, lambda: emoji_line(rng))
    add(30, lambda: mixed_line(rng))
    add(2, lambda: " ".join(mixed_line(rng) for _ in range(rng.randint(14, 20))))
    add(25, lambda: phrases(rng, CODE, 1, 3, " "))
    add(15, lambda: phrases(rng, NUMBERS, 1, 2, " "))
    add(40, lambda: phrases(rng, LATIN, 1, 3, " "))
    out += EN_WORDS                                                # single words
    out += ["a", "I", "?", "7", "中", "é", "Ж", "🤖"]               # single characters
    out += ["   leading and trailing spaces   ", "tabs\tbetween\twords", "line one\nline two\r\nline three",
            "zero\u200bwidth\u200bspaces and a soft\u00adhyphen", "control\u0007char and \u0000nul",
            "Cafe\u0301 with a combining acute (NFD) vs Café (NFC)", "ＦＵＬＬＷＩＤＴＨ　ｌｅｔｔｅｒｓ　１２３",
            "MiXeD CaSe AnD ALL CAPS SHOUTING", "repeated " * 40, "!!!???...,,,;;;:::"]
    return out


def check(path, model):
    from tokenizers import Tokenizer
    with open(os.path.join(model, "sentence_bert_config.json")) as f:
        max_len = json.load(f)["max_seq_length"]
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    with open(path, encoding="utf-8") as f:
        lens = [len(tok.encode(json.loads(l)["text"].strip()).ids) for l in f]
    edges = [1, 3, 8, 16, 32, 64, 128, 192, 256, 257, 384, 512, 768, 1024, 10**9]
    print(f"{len(lens)} lines, tokens before truncation ([CLS]/[SEP] included): "
          f"min {min(lens)}, median {sorted(lens)[len(lens) // 2]}, max {max(lens)}")
    for lo, hi in zip(edges, edges[1:]):
        n = sum(lo <= x < hi for x in lens)
        label = f"{lo}-{hi - 1}" if hi < 10**9 else f"{lo}+"
        print(f"  {label:>9} {n:4d} {'#' * ((n + 3) // 4)}")
    over = sum(x > max_len for x in lens)
    after = sum(min(x, max_len) for x in lens)
    print(f"{over} lines over {max_len} tokens (truncated); {after} tokens in all after truncation")
    return over


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT)
    p.add_argument("--model", help="model folder (tokenizer.json), for --check")
    p.add_argument("--check", action="store_true", help="print the token-length histogram")
    a = p.parse_args()
    if a.check and not a.model:
        print("make_embed_sentences: --check needs --model DIR", file=sys.stderr)
        sys.exit(2)
    rng = random.Random(SEED)
    lines = texts(rng)
    rng.shuffle(lines)
    with open(a.out, "w", encoding="utf-8", newline="\n") as f:
        for t in lines:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    print(f"make_embed_sentences: {len(lines)} lines, {os.path.getsize(a.out)} bytes into {a.out}",
          file=sys.stderr)
    if a.check and check(a.out, a.model) < 20:
        print("make_embed_sentences: fewer than 20 lines over the token limit", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
