"""The words of the checker's verdicts, in English and in Chinese (core.CheckResult fills them in).

The Chinese uses the terms Chinese interviewers use (优势函数, 重要性采样比率, 裁剪, 参考模型 ...);
code identifiers, shapes and formulas stay as they are in both languages.
"""

WORDS = {
    "en": {
        "pass": "PASS {title}: all {cases} cases agree with the reference.",
        "fail": "FAIL {title}: {failed} of {cases} cases disagree with the reference.",
        "fail_signature": "FAIL {title}: the function cannot be called as the exercise calls it.",
        "unexpected": "Signature: unexpected argument {names}: your function takes {yours}, the exercise "
                      "passes {stub}.",
        "too_few": "Signature: your function takes {count} arguments {yours}; the exercise passes "
                   "{stub_count} {stub}: {names} missing.",
        "mismatch": "Signature: your function takes {yours}; the exercise passes {stub} ({names} missing, "
                    "{unexpected} unexpected).",
        "by_position": "Note: argument names differ from the stub ({renamed}); your function was called by "
                       "position, in the stub's order {stub}.",
        "dropped": "Note: your function has no parameter {names}: it was called without it, so the cases "
                   "that set it may differ.",
        "certain": "Likely mistake [{name}]: {message}",
        "pair_head": "Likely two mistakes at once: {names}.",
        "pair_item": "  [{name}] {message}",
        "possible": "Possible mistake [{name}] (it reproduces every failing case, not the passing ones): "
                    "{message}",
        "partial": "Partly explained: [{name}] reproduces {count} of the {failed} failing cases ({which}): "
                   "{message}",
        "unexplained": "The other {count} failing case(s) ({which}) have another cause; the smallest is "
                       "below.",
        "component_ref": "Output {index} ({name}) agrees with the reference on every case.",
        "component_mistake": "Output {index} ({name}) shows [{mistake}] on every case: {message}",
        "none": "No catalogued mistake matches; compare with the case below.",
        "runaway": "Stopped: {reason} {hint}",
        "timeout_reason": "a case ran longer than {limit:g} s.",
        "timeout_message": "still running after {limit:g} s",
        "budget_message": "more than the integer operations an O(log n) method needs",
        "budget_reason": "a case used more integer operations than the budget.",
        "runaway_default": "A case this small takes milliseconds: look for a loop that never ends.",
        "structure": "Output: {text}",
        "smallest": "Smallest failing case '{name}' (paste to re-run):",
        "expected": "  expected {value}",
        "got": "  got      {value}",
        "raised": "raised {error}: {message}",
        "at_line": " (at `{line}`)",
        "output_key": "output",
        "key_agrees": "  {key}: agrees",
        "key_differs": "  {key}: expected {expected}\n  {pad}  got      {got}",
        "more_notes": "Also: {text}",
        # structure messages
        "not_tuple": "returns {got}; the exercise expects a tuple of {count} ({names}).",
        "tuple_length": "returns {got} values; the exercise expects {count} ({names}).",
        "in_output": "output {index} ({name}): {inner}",
        "python_number": "returns a Python number where a tensor of shape {shape} is expected: keep the "
                         "tensor (no .item()), so that the gradient can flow.",
        "wrong_type": "returns {got} where {expected} is expected.",
        "scalar_mean": "returns one number (shape ()) where {unit} is expected (shape {shape}); it equals "
                       "their mean: drop the final .mean().",
        "scalar_sum": "returns one number (shape ()) where {unit} is expected (shape {shape}); it equals "
                      "their sum: drop the final .sum().",
        "scalar": "returns one number (shape ()) where {unit} is expected (shape {shape}).",
        "shape": "shape {got} where {expected} is expected.",
        "dtype": "dtype {got} where {expected} is expected.",
        "unit_default": "one value per element",
        "import_note": "    {line}",
    },
    "zh": {
        "pass": "通过 {title}：全部 {cases} 个用例与参考实现一致。",
        "fail": "未通过 {title}：{cases} 个用例中有 {failed} 个与参考实现不一致。",
        "fail_signature": "未通过 {title}：函数无法按练习的方式调用。",
        "unexpected": "函数签名：多出了参数 {names}。你的函数参数是 {yours}，练习传入的是 {stub}。",
        "too_few": "函数签名：你的函数有 {count} 个参数 {yours}，练习传入 {stub_count} 个 {stub}，缺少 "
                   "{names}。",
        "mismatch": "函数签名：你的函数参数是 {yours}，练习传入的是 {stub}（缺少 {names}，多出 "
                    "{unexpected}）。",
        "by_position": "提示：参数名与题目给出的不一致（{renamed}），已按题目的参数顺序 {stub}，"
                       "以位置参数调用你的函数。",
        "dropped": "提示：你的函数没有参数 {names}，调用时没有传它；用到这个参数的用例，结果可能因此不同。",
        "certain": "很可能犯了这个错误 [{name}]：{message}",
        "pair_head": "很可能同时犯了两个错误：{names}。",
        "pair_item": "  [{name}] {message}",
        "possible": "可能犯了这个错误 [{name}]（它能复现全部失败用例，但复现不了通过的用例）：{message}",
        "partial": "部分解释：[{name}] 复现了 {failed} 个失败用例中的 {count} 个（{which}）：{message}",
        "unexplained": "其余 {count} 个失败用例（{which}）另有原因，下面给出其中最小的一个。",
        "component_ref": "第 {index} 个输出（{name}）在所有用例上都与参考实现一致。",
        "component_mistake": "第 {index} 个输出（{name}）在所有用例上都符合错误 [{mistake}]：{message}",
        "none": "已收录的常见错误里没有能对上的，请对照下面的用例自己排查。",
        "runaway": "已中止：{reason}{hint}",
        "timeout_reason": "有用例运行超过了 {limit:g} 秒。",
        "timeout_message": "{limit:g} 秒后仍未结束",
        "budget_message": "整数运算次数远超 O(log n) 算法所需",
        "budget_reason": "有用例的整数运算次数超出了预算。",
        "runaway_default": "这么小的用例只需几毫秒，检查一下是否有停不下来的循环。",
        "structure": "输出：{text}",
        "smallest": "最小的失败用例“{name}”（可直接粘贴重跑）：",
        "expected": "  期望 {value}",
        "got": "  实际 {value}",
        "raised": "抛出 {error}：{message}",
        "at_line": "（出错行：`{line}`）",
        "output_key": "输出",
        "key_agrees": "  {key}：一致",
        "key_differs": "  {key}：期望 {expected}\n  {pad}  实际 {got}",
        "more_notes": "另外：{text}",
        "not_tuple": "返回的是 {got}，练习要求返回 {count} 个值组成的元组（{names}）。",
        "tuple_length": "返回了 {got} 个值，练习要求 {count} 个（{names}）。",
        "in_output": "第 {index} 个输出（{name}）：{inner}",
        "python_number": "返回的是 Python 数值，练习要求形状为 {shape} 的张量：不要调用 .item()，保留张量，"
                         "梯度才能回传。",
        "wrong_type": "返回的是 {got}，练习要求 {expected}。",
        "scalar_mean": "返回的是一个标量（形状 ()），练习要求{unit}（形状 {shape}）；"
                       "这个标量等于它们的均值：去掉最后的 .mean()。",
        "scalar_sum": "返回的是一个标量（形状 ()），练习要求{unit}（形状 {shape}）；这个标量等于它们的和："
                      "去掉最后的 .sum()。",
        "scalar": "返回的是一个标量（形状 ()），练习要求{unit}（形状 {shape}）。",
        "shape": "形状为 {got}，练习要求 {expected}。",
        "dtype": "数据类型为 {got}，练习要求 {expected}。",
        "unit_default": "每个元素一个值",
        "import_note": "    {line}",
    },
}
