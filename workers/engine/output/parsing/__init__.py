"""A generated answer split into reasoning, content and tool calls, as the model's family writes them.

Each choice of a chat or Responses job gets one parser (`make_parser`); the sequence feeds it the text
of every step and the pieces it returns travel in the ChoiceDelta's `parts` (protocol.Part), which the
web side only shapes. Which parser: protocol.output_formats (the catalog's override, the tokenizer's
`response_template`, the model's family). A malformed or cut tool call is never an error: before its
name is read its text stays in the content, as the model wrote it; after, the call ends as far as it
was written.

- `parts.py`: the pieces and the call ids; `markers.py`: the text scanning they share;
- `regions.py`: the marker-delimited formats (most families), `families.py` their markers and call syntax,
  `reading.py` a tool-call region read as it arrives (a call opens at its name, its arguments stream);
- `harmony.py`: gpt-oss's channels (openai-harmony's parser where its encoding loads);
- `template.py`: transformers' own parser for a tokenizer that declares a `response_template`;
- `tool_grammars.py`: tool_choice required/named as a grammar in the family's own syntax.
"""
from workers.engine.output.parsing.factory import OutputFormat, make_parser, output_format  # noqa: F401
