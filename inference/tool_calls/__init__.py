"""Tool calling on /v1/chat/completions, as OpenAI clients expect it.

- ``schemas``: tool definitions, tool_choice, tool calls in messages.
- ``checks``: request rules across fields (400s naming the param).
- ``setup``: what tools and tool_choice mean for the prompt, the sampler
  (``structured_output`` for "required" and named functions) and parsing.
- ``template``: rendering with the model's template or ``chatml_tools.jinja``.
- ``extractor``: content and tool-call deltas out of the text, streamed.
- ``output``: the relay's formatters over events rewritten for tool calls.
"""
