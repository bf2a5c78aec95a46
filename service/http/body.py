"""Reading a request body into its pydantic model: 415, 400 or 422, never a 500.

JSON is parsed strictly (`store.strict_json`): one document, no duplicate keys,
no NaN or Infinity. Errors carry paths and rule names, never values, and never the name of a member
the model does not know (that is reported as "(unknown member)").
"""

from __future__ import annotations

from typing import TypeVar

from flask import request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException

from service.api.reasons import Reason
from service.http.problems import Problem
from store.record.violations import violations_of
from store.strict_json import MalformedJson, strict_loads

M = TypeVar("M", bound=BaseModel)
MAX_BODY_BYTES = 1024 * 1024


def json_body(model: type[M], *, optional: bool = False) -> M:
    """The request body as model. With optional, an empty body means the model's defaults."""
    try:
        raw = request.get_data(cache=True)
    except HTTPException:
        raise  # 413 and friends keep their own status
    except Exception:  # the server's body reader: bad chunking, a cut connection
        raise Problem(Reason.MALFORMED_REQUEST) from None
    if optional and not raw:
        return model()
    if request.mimetype != "application/json" and not request.mimetype.endswith("+json"):
        raise Problem(Reason.UNSUPPORTED_MEDIA_TYPE)
    try:
        document = strict_loads(raw)
    except MalformedJson:
        raise Problem(Reason.MALFORMED_JSON) from None
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise Problem(Reason.VALIDATION_FAILED, errors=violations_of(error, model)) from None
