"""Syntax: the lexer, the parser, the syntax tree (`tree`) and program loading (`program`)."""
