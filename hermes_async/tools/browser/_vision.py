"""``browser_vision``'s model call: a screenshot and a question to a vision-capable chat model.

The PNG goes as a ``data:`` URL ``image_url`` part. The operator configures the endpoint, so it
is not SSRF-vetted; its key is only in the ``Authorization`` header and redacted from errors.
"""

from __future__ import annotations

import base64

import anyio
import httpx

from hermes_async._net import default_ssl_context, redact_urls
from hermes_async.jsontypes import JSON
from hermes_async.tools._web_fetch import NonClosingTransport, aclose_client
from hermes_async.tools.browser.settings import VisionSettings

__all__ = ("VISION_UNAVAILABLE", "VisionError", "analyze_screenshot")

#: ``browser_vision``'s answer when no vision model is configured (the reference's first
#: sentence, then this project's settings).
VISION_UNAVAILABLE = (
    "Browser vision unavailable: no auxiliary vision model configured. Set "
    "HERMES_BROWSER_VISION_URL and HERMES_BROWSER_VISION_MODEL (an OpenAI-compatible server "
    "with a vision-capable model), or BrowserSettings.vision, to enable browser vision."
)


class VisionError(Exception):
    """The vision model could not be asked or gave no answer (the message is redacted)."""


def _prompt(question: str) -> str:
    return (
        "You are analyzing a screenshot of a web browser.\n\n"
        f"User's question: {question}\n\n"
        "Provide a detailed and helpful answer based on what you see in the screenshot. "
        "If there are interactive elements, describe them. If there are verification "
        "challenges or CAPTCHAs, describe what type they are and what action might be needed. "
        "Focus on answering the user's specific question."
    )


async def analyze_screenshot(settings: VisionSettings, question: str, png: bytes) -> str:
    """Ask the vision model ``question`` about the screenshot ``png``; return its answer.

    Raises:
        VisionError: Timeout, HTTP failure, or an answer without text.

    **Cancellation**: the request is abandoned and the client closed (shielded, bounded).
    """
    image = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    body = {
        "model": settings.model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": _prompt(question)},
                    {"type": "image_url", "image_url": {"url": image}},
                ],
            }
        ],
        "max_tokens": settings.max_tokens,
        "temperature": 0.1,
    }
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    client = httpx.AsyncClient(
        transport=NonClosingTransport(settings.transport) if settings.transport else None,
        timeout=httpx.Timeout(settings.timeout),
        verify=default_ssl_context(),
    )
    try:
        with anyio.fail_after(settings.timeout):
            response = await client.post(
                settings.base_url.rstrip("/") + "/chat/completions", json=body, headers=headers
            )
        response.raise_for_status()
        data: JSON = response.json()
        answer = data["choices"][0]["message"]["content"]
    except TimeoutError:
        raise VisionError(
            f"the vision model did not answer within {settings.timeout:g} seconds"
        ) from None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        detail = redact_urls(_redact(f"{type(exc).__name__}: {exc}", settings.api_key))
        raise VisionError(detail) from None
    finally:
        await aclose_client(client, "close the vision client")
    if not isinstance(answer, str) or not answer.strip():
        raise VisionError("the vision model returned an empty answer")
    return answer.strip()


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "[REDACTED]") if secret else text
