"""The JSON schema the structured-output tests constrain answers to."""
from __future__ import annotations



PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "tags", "address"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                    "properties": {"city": {"type": "string", "maxLength": 10},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                   "verified": {"type": "boolean"}}},
    },
}
