"""bench.engine.window_capacity on a small case: a pool that holds two whole chats decodes more of them at once
when the blocks behind the window are given back, and the console's estimate says so before the run; for a
model whose layers all slide, and for one that mixes windowed and global layers (the pool in layer groups)."""

from __future__ import annotations

from pathlib import Path

from bench.engine.window_capacity import parse, serve, write_model


def test_giving_back_blocks_behind_the_window_decodes_more_chats_at_once(tmp_path: Path) -> None:
    args = parse(["--window", "32", "--prompt", "160", "--output", "16", "--chats", "6", "--blocks", "24"])
    layers = write_model(tmp_path, args.model, args.window, args.prompt + args.output)
    given_back, kept = serve(tmp_path, args, layers, True), serve(tmp_path, args, layers, False)
    # 11 blocks a whole chat: two at once; 3 blocks a windowed one (its window, the next partly filled), more while
    # a prefill chunk is in flight.
    assert kept.most_decoding == 2 and given_back.most_decoding >= 4, (given_back, kept)
    assert kept.room == "Room for about 2 more 176-token chats" and given_back.room.startswith("Room for about 8 ")


def test_a_model_mixing_windowed_and_global_layers_gives_back_its_windowed_blocks(tmp_path: Path) -> None:
    """Gemma 3's pattern, five windowed layers to one global: a page holds one layer, a chat of 11 blocks takes
    11 pages in the global group and 3 in each of the five windowed ones (26 against 66 kept whole)."""
    args = parse(
        ["--model", "gemma3", "--window", "32", "--prompt", "160", "--output", "16", "--chats", "6", "--blocks", "24"]
    )
    layers = write_model(tmp_path, args.model, args.window, args.prompt + args.output)
    given_back, kept = serve(tmp_path, args, layers, True), serve(tmp_path, args, layers, False)
    assert kept.most_decoding == 2 and given_back.most_decoding >= 4, (given_back, kept)
    assert kept.room == "Room for about 2 more 176-token chats", kept.room
    assert given_back.room == "Room for about 5 more 176-token chats", given_back.room  # 144 pages // 26
