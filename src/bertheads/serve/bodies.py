"""Request bodies that cannot be read, answered 422 with a one-line `detail` like any other bad
input (FastAPI's own answer is a 400 "There was an error parsing the body"): bytes that are not
UTF-8, JSON nested too deeply, a number too long to read, a body declared in another type or
character set than UTF-8 JSON; and texts with nothing a model can read in them."""

from __future__ import annotations

import email.message
import unicodedata

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertheads.base.errors import first_line

PARSE_FAILED = "There was an error parsing the body"  # FastAPI's detail for a body its JSON reader refused
INVISIBLE = ("Cc", "Cf")  # control and format characters (zero-width space, joiners, BOM): BERT drops them


def body_problem(exc: BaseException) -> str:
    """The one-line detail for a body FastAPI's JSON reader refused with `exc`."""
    if isinstance(exc, UnicodeDecodeError):
        return f"the body is not UTF-8 text (byte {exc.start + 1}); send JSON encoded as UTF-8"
    if isinstance(exc, RecursionError):
        return "malformed JSON (nested too deeply)"
    if isinstance(exc, ValueError) and "digits" in str(exc):
        return "malformed JSON (a number with too many digits)"
    return f"the body could not be read as JSON ({first_line(exc)})"


def content_type_problem(value: str | None) -> str | None:
    """What is wrong with a request's Content-Type for a JSON body (None: nothing; no header is
    read as JSON)."""
    if not value:
        return None
    message = email.message.Message()
    message["content-type"] = value
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (subtype == "json" or subtype.endswith("+json")):
        return f"Content-Type {message.get_content_type()}: send the body as JSON (Content-Type: application/json)"
    charset = message.get_param("charset")
    if isinstance(charset, str) and charset.lower().replace("_", "-") not in ("utf-8", "utf8"):
        return f"Content-Type charset={charset}: JSON bodies are UTF-8; send charset=utf-8 (or none)"
    return None


def blank(text: str) -> bool:
    """A text with nothing to read: only white space, control and format characters."""
    return all(ch.isspace() or unicodedata.category(ch) in INVISIBLE for ch in text)


def add_body_handlers(app: FastAPI) -> None:
    """A body FastAPI could not parse: 422 with what was wrong (other HTTP errors as before)."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.detail == PARSE_FAILED and exc.__cause__ is not None:
            return JSONResponse({"detail": body_problem(exc.__cause__)}, status_code=422)
        return await http_exception_handler(request, exc)
