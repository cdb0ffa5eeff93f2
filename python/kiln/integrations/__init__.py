"""kiln.integrations — kiln under other libraries' extension points.

    import kiln.integrations.transformers        # attn_implementation="kiln" in transformers

Each submodule imports its library and registers kiln with it on import; nothing here is
imported by `import kiln`.
"""
