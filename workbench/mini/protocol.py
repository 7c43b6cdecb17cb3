"""The request bodies of ``POST /v1/completions`` and ``POST /v1/chat/completions`` as pydantic
models with bounds, the chat template, and OpenAI-style error bodies.

Every field is checked before the engine sees the request; a bad one is answered with a 4xx JSON
error whose ``param`` names it. Types are strict (``"5"`` is not a seed, ``true`` is not a token
id) and numbers are bounded, so nothing a client sends can overflow the engine's sampler or its
random generator. Model-specific limits (vocabulary, positions, KV pool size) are checked by
:func:`check_against_model` with the same error shape.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from workbench.errors import WorkbenchError

MAX_PROMPT_TOKENS = 65_536  # ids in one prompt (a string prompt: this many UTF-8 bytes)
MAX_TOKENS = 65_536
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds
MAX_TEMPERATURE = 2.0
GREEDY_BELOW = 1e-5  # as vLLM: smaller temperatures sample greedily (logits / 1e-300 overflow)
MAX_STOP = 4  # stop strings, as OpenAI
MAX_STOP_CHARS = 64
MAX_STOP_IDS = 64
MAX_TOKEN_ID = 2**31 - 1

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


# OpenAI / vLLM sampling fields this server does not implement, with the values that ask for
# nothing (sent by clients that fill every field): any other value is a 400, not ignored.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None,), "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
    "logit_bias": (None, {}), "frequency_penalty": (None, 0), "presence_penalty": (None, 0),
    "top_p": (None, 1), "top_k": (None, -1, 0), "min_p": (None, 0),
    "repetition_penalty": (None, 1), "prompt_logprobs": (None,), "guided_json": (None,),
    "response_format": (None,),
}


class SamplingRequest(BaseModel):
    """The fields both endpoints read. A field of :data:`UNSUPPORTED` asking for something is
    refused; other unknown fields are ignored, as OpenAI's server does."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = Field(None, max_length=256)
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    n: int = Field(1, ge=1, le=1)  # one completion per request
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_IDS)
    ignore_eos: bool = False  # accepted; the model has no EOS token

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, v: Any) -> Any:
        stops = [v] if isinstance(v, str) else v
        if v is None:
            return v
        if not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
            raise ValueError("must be a string or a list of strings")
        if len(stops) > MAX_STOP or any(not 1 <= len(s) <= MAX_STOP_CHARS for s in stops):
            raise ValueError(f"at most {MAX_STOP} strings of 1..{MAX_STOP_CHARS} characters")
        return stops

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling_temperature(self) -> float:
        return 0.0 if self.temperature < GREEDY_BELOW else self.temperature


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: a prompt string or token ids."""

    prompt: str | list[TokenId]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        """A string or a list of token ids; a one-element batch (``["text"]``, ``[[1, 2]]``) is
        that one prompt. Checked here in full so a bad prompt gets one plain message."""
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]
        if isinstance(v, str):
            ok = True
        elif isinstance(v, list):
            ok = all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in v)
        else:
            ok = False
        if not ok:
            raise ValueError("must be a string or a list of token ids (ints 0..2^31-1), one "
                             "prompt per request")
        if not 1 <= len(v) <= MAX_PROMPT_TOKENS:
            raise ValueError(f"must hold 1..{MAX_PROMPT_TOKENS} characters or token ids")
        return v

    def prompt_ids(self) -> list[int]:
        """Prompt string -> token ids: its UTF-8 bytes."""
        return encode(self.prompt) if isinstance(self.prompt, str) else list(self.prompt)


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_PROMPT_TOKENS)


class ChatRequest(SamplingRequest):
    """``POST /v1/chat/completions``: messages, laid out by :func:`chat_prompt`."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)  # OpenAI's newer name

    def model_post_init(self, _context: Any) -> None:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens

    def prompt_ids(self) -> list[int]:
        ids = encode(chat_prompt(self.messages))
        if len(ids) > MAX_PROMPT_TOKENS:
            raise ApiError(400, f"messages: the chat prompt holds {len(ids)} bytes, more than "
                           f"{MAX_PROMPT_TOKENS}", "messages")
        return ids


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The chat template over the byte tokenizer: each message as ``<|role|>`` and its text on
    the next line, then ``<|assistant|>`` for the reply (the model has no template of its
    own; random weights read any layout equally)."""
    return "".join(f"<|{m.role}|>\n{m.content}\n" for m in messages) + "<|assistant|>\n"


def encode(text: str) -> list[int]:
    """Prompt string -> token ids: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Token ids -> text: one Latin-1 character per id (``id % 256``)."""
    return "".join(chr(t % 256) for t in ids)


class ApiError(WorkbenchError):
    """An answer other than a completion: HTTP status, a message that says what to change, and
    the field at fault (OpenAI's ``param``)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}


def parse_request(raw: bytes, kind: type[SamplingRequest] = CompletionRequest) -> Any:
    """Validate a body as ``kind``; every problem becomes one ApiError(400) naming the first
    bad field."""
    try:
        req = kind.model_validate_json(raw or b"{}")
    except ValidationError as err:
        problems = err.errors(include_url=False, include_input=False)
        where = [".".join(str(p) for p in e["loc"]) or "body" for e in problems]
        text = "; ".join(f"{w}: {e['msg'].removeprefix('Value error, ')}"
                         for w, e in zip(where, problems, strict=True))
        # ``param`` is the field (``stop_token_ids``); the message also says which item (``.0``)
        param = ".".join(p for p in problems[0]["loc"] if isinstance(p, str)) or "body"
        raise ApiError(400, text, param) from None
    refuse_unsupported(req.model_extra or {})
    return req


def refuse_unsupported(extra: dict[str, Any]) -> None:
    """A 400 naming the first field this server does not implement, set to a value that asks
    for it (``logprobs: 1``, ``echo: true``)."""
    for name, neutral in UNSUPPORTED.items():
        if name in extra and not any(_same(extra[name], n) for n in neutral):
            raise ApiError(400, f"{name}: not supported by this server (its only sampling "
                           "controls are temperature, seed, max_tokens, stop and "
                           f"stop_token_ids); leave {name} out", name)


def _same(value: Any, neutral: Any) -> bool:
    """``value`` is ``neutral`` (``True`` is not ``1``, ``1.0`` is)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return type(value) in (int, float, type(None), str, dict) and value == neutral


def check_against_model(req: SamplingRequest, ids: list[int], vocab_size: int,
                        max_position: int, pool_tokens: int) -> None:
    """Limits of this model and pool, named by the field to change."""
    if any(t >= vocab_size for t in ids):
        raise ApiError(400, f"prompt: token ids must lie in 0..{vocab_size - 1}", "prompt")
    total = len(ids) + req.max_tokens
    if total > max_position:
        raise ApiError(400, f"max_tokens: prompt ({len(ids)}) + max_tokens ({req.max_tokens}) "
                       f"exceeds the model's {max_position} positions", "max_tokens")
    if total > pool_tokens:
        raise ApiError(400, f"max_tokens: prompt ({len(ids)}) + max_tokens ({req.max_tokens}) "
                       f"exceeds the KV pool ({pool_tokens} tokens)", "max_tokens")


class StopMatcher:
    """Text-level ``stop`` strings over a token stream: ``feed`` returns the text safe to send now
    (held back while it could still begin a stop string) and whether a stop string was seen; the
    stop string itself is never sent, as OpenAI."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buf = ""

    def feed(self, text: str) -> tuple[str, bool]:
        self.buf += text
        cut = min((i for i in (self.buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.buf = self.buf[:cut], ""
            return out, True
        keep = len(self.buf) - self.hold if self.hold else len(self.buf)
        out, self.buf = self.buf[:max(keep, 0)], self.buf[max(keep, 0):]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out
