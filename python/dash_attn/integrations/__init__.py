"""Integrations of dash_attn with other libraries, one module each (transformers.py: Hugging Face Transformers), and
_transformers_hook.py, which `import dash_attn` uses to register with Transformers once Transformers loads.

This package imports nothing: importing dash_attn.integrations needs neither torch nor any integrated library.
Each module imports its library itself and says in its ImportError which version it needs; the hook imports only
the standard library.
"""
