"""A byte-level BPE tokenizer trained on the corpus (Qwen-style: digits split one by one, chat template with
<|im_start|> / <|im_end|>), saved in the Hugging Face layout (tokenizer.json, tokenizer_config.json)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specdec.training.corpus import ENDOFTEXT, IM_END, IM_START, read_corpus, text_chunks

SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int = 8192) -> PreTrainedTokenizerFast:
    """BPE over bytes, `vocab_size` entries including the 256 bytes and the special tokens."""
    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must exceed the 256 bytes and {len(SPECIAL_TOKENS)} special tokens, "
                         f"got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=True)
    tokenizer.train_from_iterator(text_chunks(texts), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=IM_END, pad_token=ENDOFTEXT, bos_token=None, unk_token=None,
        additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE, model_max_length=4096,
    )


def train_corpus_tokenizer(data: Path | str, out: Path | str, vocab_size: int = 8192) -> PreTrainedTokenizerFast:
    """`specdec train-tokenizer`: train on the training parts of the corpus in `data` and save to `out`."""
    tokenizer = train_tokenizer([file.train for file in read_corpus(data)], vocab_size)
    tokenizer.save_pretrained(out)
    return tokenizer
