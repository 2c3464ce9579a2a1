"""``store.db.load_json``: the json/jsonb loader of every store connection answers exactly
what ``json.loads`` answers (or raises as it does), for every text Postgres could send."""

from __future__ import annotations

import json

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runfleet.store.config import Settings
from runfleet.store.db import connection_kwargs, load_json

TEXTS = [
    '{"args":[],"kwargs":{}}',
    "null",
    "12345678901234567890123456789",
    "1.50",
    '"\\u00e9\\ud83d\\ude00"',
    ' {"a": 1} ',  # a json column keeps the text it was given, whitespace included
    "\n[1, 2]\t",
    "[1] [2]",  # not one document: json.loads raises
    "",
    "nope",
    '{"a": NaN}',
]


def _same(text: str) -> None:
    try:
        expected: object = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)):
            load_json(text.encode())
        return
    got = load_json(text.encode())
    assert got == expected and type(got) is type(expected)
    assert load_json(text) == expected


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_loads_as_json_loads_loads_it(text: str) -> None:
    _same(text)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)),
       st.sampled_from(["", " ", "\n", "\t "]), st.sampled_from(["", " ", "\r\n"]))  # fmt: skip
def test_any_json_document_loads_as_json_loads_loads_it(
    value: object, before: str, after: str
) -> None:
    _same(before + json.dumps(value) + after)


async def test_store_connections_decode_json_with_it(settings: Settings) -> None:
    kwargs = connection_kwargs(settings)
    async with await psycopg.AsyncConnection.connect(settings.database_url, **kwargs) as conn:
        for oid in (114, 3802):  # json, jsonb
            loader = conn.adapters.get_loader(oid, psycopg.pq.Format.TEXT)
            assert loader is not None and loader(oid, conn).load(b"[1]") == [1]
            assert getattr(loader, "_loads", None) is load_json
        cur = await conn.execute("SELECT %s::json AS a, %s::jsonb AS b", (" [1.50] ", '{"x":2}'))
        assert await cur.fetchone() == {"a": [1.5], "b": {"x": 2}}
