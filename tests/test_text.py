"""Streaming text assembly: UTF-8 boundaries and stop strings (pure, no model)."""

from __future__ import annotations

from edge_spec.decode.text import TextAssembler


def feed_all(assembler: TextAssembler, pieces: list[bytes]) -> list[str]:
    out = []
    for piece in pieces:
        stopped = assembler.feed(piece)
        out.append(assembler.take_ready())
        if stopped:
            break
    out.append(assembler.finish())
    return out


def test_multibyte_character_split_across_tokens_is_never_split() -> None:
    euro = "€".encode()  # 3 bytes
    deltas = feed_all(TextAssembler(), [b"price: ", euro[:1], euro[1:2], euro[2:], b"5"])
    assert deltas == ["price: ", "", "", "€", "5", ""]


def test_emoji_four_bytes_one_at_a_time() -> None:
    data = "ok 🙂 done".encode()
    deltas = feed_all(TextAssembler(), [data[i : i + 1] for i in range(len(data))])
    assert "".join(deltas) == "ok 🙂 done"
    assert all("\ufffd" not in d for d in deltas)


def test_dangling_bytes_at_the_end_become_replacement_char() -> None:
    assert "".join(feed_all(TextAssembler(), [b"abc", "€".encode()[:2]])) == "abc\ufffd"


def test_stop_string_cuts_text_and_is_never_leaked() -> None:
    assembler = TextAssembler(stop=["END"])
    deltas = feed_all(assembler, [b"one E", b"N", b"D two"])
    assert "".join(deltas) == "one "
    assert assembler.stopped and assembler.text == "one "
    assert all("E" not in d for d in deltas)


def test_stop_prefix_that_does_not_complete_is_released() -> None:
    assembler = TextAssembler(stop=["END"])
    deltas = feed_all(assembler, [b"E", b"N", b"ZYME"])
    assert deltas[:2] == ["", ""]
    assert "".join(deltas) == "ENZYME"
    assert not assembler.stopped


def test_first_of_several_stop_strings_wins() -> None:
    assembler = TextAssembler(stop=["\n\n", "Q:"])
    feed_all(assembler, [b"answer Q: next\n\nmore"])
    assert assembler.text == "answer "


def test_spans_mark_the_characters_accepted_drafts_gave() -> None:
    assembler = TextAssembler(stop=["END"])
    assembler.feed(b"The ", from_draft=False)
    assembler.feed(b"quick ", from_draft=True)
    assembler.feed("brown €".encode()[:-1], from_draft=True)  # the euro sign is incomplete
    assert assembler.take_ready_spans() == [("The ", False), ("quick brown ", True)]
    assembler.feed("€".encode()[-1:] + b" E", from_draft=False)  # completes it; "E" held back
    assert assembler.take_ready_spans() == [("€ ", False)]
    assert assembler.feed(b"ND tail", from_draft=True)  # the stop string: cut before it
    assert assembler.finish_spans() == []
    assert assembler.text == "The quick brown € "
