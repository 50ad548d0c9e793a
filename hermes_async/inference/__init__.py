"""Model-server clients and the tokenizer layer.

* Phase 2 token clients (:mod:`~hermes_async.inference.generate`): prompt ids in, exact
  completion ids and logprobs out, for vLLM, the Atropos reference server and SGLang.
* Phase 1 chat client (:mod:`~hermes_async.inference.chat`): OpenAI-compatible chat
  completions, returning objects shaped like the OpenAI SDK's.
* Several servers behind one client (:mod:`~hermes_async.inference.pool`): session-affine,
  load-aware placement, adaptive per-server concurrency, failover and ejection.
* The shared HTTP layer's settings (:class:`HTTPOptions`, :class:`RetryPolicy`), error tree
  (:class:`ModelServerError` and its subclasses) and reachability probe (:func:`probe_server`).
* Tokenizers (:mod:`~hermes_async.inference.tokenizer`).
"""

from __future__ import annotations

from hermes_async._exports import fixup_module_metadata
from hermes_async.inference._errors import (
    ModelServerError,
    ServerConnectError,
    ServerProtocolError,
    ServerStatusError,
    ServerTimeoutError,
    StreamInterruptedError,
)
from hermes_async.inference._http import HTTPOptions, probe_server
from hermes_async.inference._retry import RetryPolicy
from hermes_async.inference.chat import (
    ChatClient,
    ChatCompletion,
    ChatMessage,
    ChatStream,
    ChatStreamAssembler,
    Choice,
    FunctionCall,
    ToolCall,
    Usage,
)
from hermes_async.inference.generate import (
    AtroposGenerateClient,
    Completion,
    GenerateClient,
    InvalidTokenDataError,
    SamplingParams,
    SGLangGenerateClient,
    TokenClient,
    TokenDelta,
    TokenStream,
    VLLMGenerateClient,
)
from hermes_async.inference.pool import (
    PoolOptions,
    PoolStatistics,
    ServerPool,
    ServerStatistics,
    pool_session,
)
from hermes_async.inference.tokenizer import (
    QWEN_OFFLINE_NAME,
    IncrementalDecoder,
    QwenTokenizer,
    Tokenizer,
    load_tokenizer,
)

__all__ = (
    "QWEN_OFFLINE_NAME",
    "AtroposGenerateClient",
    "ChatClient",
    "ChatCompletion",
    "ChatMessage",
    "ChatStream",
    "ChatStreamAssembler",
    "Choice",
    "Completion",
    "FunctionCall",
    "GenerateClient",
    "HTTPOptions",
    "IncrementalDecoder",
    "InvalidTokenDataError",
    "ModelServerError",
    "PoolOptions",
    "PoolStatistics",
    "QwenTokenizer",
    "RetryPolicy",
    "SGLangGenerateClient",
    "SamplingParams",
    "ServerConnectError",
    "ServerPool",
    "ServerProtocolError",
    "ServerStatistics",
    "ServerStatusError",
    "ServerTimeoutError",
    "StreamInterruptedError",
    "TokenClient",
    "TokenDelta",
    "TokenStream",
    "Tokenizer",
    "ToolCall",
    "Usage",
    "VLLMGenerateClient",
    "load_tokenizer",
    "pool_session",
    "probe_server",
)


fixup_module_metadata(__name__, globals())
