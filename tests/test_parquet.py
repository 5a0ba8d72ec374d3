import pyarrow.parquet as pq

from webapp.kernel.parquet import parquet_file


def _rows(messages):
    return pq.read_table(parquet_file([{"messages": messages, "n": 1}], columns={"n": "int"})).to_pylist()


def test_a_lone_tool_call_logged_as_an_object_is_kept_as_a_list_of_one():
    call = {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}
    (row,) = _rows([{"role": "assistant", "content": "", "tool_calls": call}])
    assert row["messages"][0]["tool_calls"] == [call]


def test_tool_calls_of_a_shape_no_reader_knows_are_null_not_an_error():
    (row,) = _rows([{"role": "assistant", "content": "x", "tool_calls": "lookup_order()"}])
    assert row["messages"][0]["tool_calls"] is None and row["messages"][0]["content"] == "x"
