"""Code extraction from what models really emit: one table, each case run for real."""
import pytest

from servesweep.correctness.extract import extract, fenced_blocks, normalize

pytestmark = pytest.mark.shares_host

PROMPT = ('from typing import List\n\n\ndef add_all(xs: List[int], k: int) -> List[int]:\n'
          '    """Add k to every element.\n    >>> add_all([1, 2], 3)\n    [4, 5]\n    """\n')
HELPER_PROMPT = ('def is_even(n: int) -> bool:\n    return n % 2 == 0\n\n\n'
                 'def count_even(xs: list) -> int:\n    """Count the even numbers in xs."""\n')
DEF = "def add_all(xs, k):\n    return [x + k for x in xs]\n"
RIGHT = [4, 5]

# (case id, completion, prompt, entry point, expected result of entry(*ARGS), expected style)
CASES = [
    ("completion_body", "    return [x + k for x in xs]\n", PROMPT, "add_all", RIGHT, "completion"),
    ("completion_then_prose", "    return [x + k for x in xs]\n\nThis adds k to each item.\n", PROMPT, "add_all",
     RIGHT, "completion"),
    ("completion_then_main_guard", "    return [x + k for x in xs]\n\n\nif __name__ == '__main__':\n"
     "    print(add_all([1], 2))\n", PROMPT, "add_all", RIGHT, "completion"),
    ("completion_then_print", "    return [x + k for x in xs]\n\n\nprint(add_all([1], 2))\n", PROMPT, "add_all",
     RIGHT, "completion"),
    ("completion_helper_after", "    return [inc(x, k) for x in xs]\n\n\ndef inc(x, k):\n    return x + k\n",
     PROMPT, "add_all", RIGHT, "completion"),
    ("completion_crlf", "    out = []\r\n    for x in xs:\r\n        out.append(x + k)\r\n    return out\r\n",
     PROMPT, "add_all", RIGHT, "completion"),
    ("completion_tabs", "\tout = []\n\tfor x in xs:\n\t\tout.append(x + k)\n\treturn out\n", PROMPT, "add_all",
     RIGHT, "completion"),
    ("completion_two_space_indent", "  out = []\n  for x in xs:\n    out.append(x + k)\n  return out\n", PROMPT,
     "add_all", RIGHT, "completion"),
    ("completion_unindented", "return [x + k for x in xs]\n\nThat is all.", PROMPT, "add_all", RIGHT,
     "completion"),
    ("completion_cut_in_next_def", "    return [x + k for x in xs]\n\n\ndef unused(a,\n    b", PROMPT, "add_all",
     RIGHT, "completion"),
    ("completion_cut_mid_expression", "    out = [x + k for x in xs]\n    return out\n    if len(out) > 10 and (",
     PROMPT, "add_all", RIGHT, "completion"),
    ("completion_uses_prompt_helper", "    return sum(1 for x in xs if is_even(x))\n", HELPER_PROMPT,
     "count_even", 1, "completion"),
    ("fenced_python", f"Here you go:\n```python\nfrom typing import List\n\n{DEF}```\nHope it helps.", PROMPT,
     "add_all", RIGHT, "fenced"),
    ("fenced_no_tag", f"```\n{DEF}```", PROMPT, "add_all", RIGHT, "fenced"),
    ("fenced_py_tag", f"```py\n{DEF}```", PROMPT, "add_all", RIGHT, "fenced"),
    ("fenced_tilde", f"~~~python\n{DEF}~~~\n", PROMPT, "add_all", RIGHT, "fenced"),
    ("fenced_needs_prompt_import", "```python\ndef add_all(xs: List[int], k: int) -> List[int]:\n"
     "    return [x + k for x in xs]\n```", PROMPT, "add_all", RIGHT, "fenced"),
    ("blocks_example_first", f"Usage:\n```python\nprint(add_all([1], 1))\n```\nCode:\n```python\n{DEF}```",
     PROMPT, "add_all", RIGHT, "fenced"),
    ("blocks_helper_in_other_block", "```python\nimport operator\n\ndef inc(x, k):\n"
     "    return operator.add(x, k)\n```\nThen:\n```python\ndef add_all(xs, k):\n"
     "    return [inc(x, k) for x in xs]\n```", PROMPT, "add_all", RIGHT, "fenced"),
    ("blocks_corrected_version_last", "```python\ndef add_all(xs, k):\n    return xs\n```\nOops, fixed:\n"
     f"```python\n{DEF}```", PROMPT, "add_all", RIGHT, "fenced"),
    ("blocks_wrong_assert_after", f"```python\n{DEF}```\nTest:\n```python\nassert add_all([1], 1) == [3]\n```",
     PROMPT, "add_all", RIGHT, "fenced"),
    ("block_with_usage_inside", f"```python\n{DEF}\nprint(add_all([1, 2], 3))\nassert add_all([0], 0) == [1]\n"
     "x = input()\n```", PROMPT, "add_all", RIGHT, "fenced"),
    ("unclosed_fence_cut", f"```python\n{DEF}\n\ndef extra(y):\n    return y +", PROMPT, "add_all", RIGHT,
     "fenced"),
    ("other_language_block_first", f"```bash\npip install nothing\n```\n```python\n{DEF}```", PROMPT, "add_all",
     RIGHT, "fenced"),
    ("fenced_in_list_item", "1. The code:\n   ```python\n   def add_all(xs, k):\n"
     "       return [x + k for x in xs]\n   ```\n", PROMPT, "add_all", RIGHT, "fenced"),
    ("fenced_crlf", "```python\r\ndef add_all(xs, k):\r\n    return [x + k for x in xs]\r\n```\r\n", PROMPT,
     "add_all", RIGHT, "fenced"),
    ("fenced_tabs_and_spaces", "```python\ndef add_all(xs, k):\n\tout = []\n    for x in xs:\n"
     "\t\tout.append(x + k)\n    return out\n```", PROMPT, "add_all", RIGHT, "fenced"),
    ("fenced_body_only", "```python\n    return [x + k for x in xs]\n```", PROMPT, "add_all", RIGHT, "fenced"),
    ("fenced_body_unindented", "```python\nreturn [x + k for x in xs]\n```", PROMPT, "add_all", RIGHT,
     "fenced"),
    ("think_then_fence", "<think>Maybe def add_all(xs, k): return None</think>\n"
     f"```python\n{DEF}```", PROMPT, "add_all", RIGHT, "fenced"),
    ("think_then_completion", "<think>\nadd k\n</think>\n    return [x + k for x in xs]\n", PROMPT, "add_all",
     RIGHT, "completion"),
    ("think_opened_in_template", f"k goes to each element</think>\n```python\n{DEF}```", PROMPT, "add_all",
     RIGHT, "fenced"),
    ("think_cut_by_max_tokens", "<think>I will write def add_all(xs, k): return", PROMPT, "add_all", None,
     "empty"),
    ("bare_def_prose_around", f"Sure! Here is the function:\n\n{DEF}\nThis adds k to each element.\n", PROMPT,
     "add_all", RIGHT, "bare"),
    ("bare_def_helper_and_import_before", "import operator\n\ndef inc(x, k):\n    return operator.add(x, k)\n\n"
     "def add_all(xs, k):\n    return [inc(x, k) for x in xs]\n", PROMPT, "add_all", RIGHT, "bare"),
    ("prompt_echoed_then_body", PROMPT + "    return [x + k for x in xs]\n", PROMPT, "add_all", RIGHT, "bare"),
    ("empty_completion", "", PROMPT, "add_all", None, "empty"),
    ("wrong_solution_stays_wrong", "    return xs\n", PROMPT, "add_all", [1, 2], "completion"),
]
ARGS = {"add_all": ([1, 2], 3), "count_even": ([1, 2, 3],)}


@pytest.mark.parametrize("completion,prompt,entry,expected,style", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_extracted_program_runs(completion, prompt, entry, expected, style):
    result = extract(completion, prompt, entry)
    namespace: dict = {}
    exec(compile(result.program, "program.py", "exec"), namespace)
    assert namespace[entry](*ARGS[entry]) == expected
    assert result.style == style


def test_table_is_large_enough():
    assert len(CASES) >= 25


def test_fenced_blocks_reports_tags_and_unclosed_tail():
    blocks = fenced_blocks("a\n```Python\nx = 1\n```\nb\n```\ny = 2")
    assert blocks == [("python", "x = 1"), ("", "y = 2")]


def test_normalize_line_ends_and_thinking():
    assert normalize("a\r\nb\rc<think>no</think>d") == "a\nb\ncd"

