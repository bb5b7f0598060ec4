"""What sparkdist's processes share, wherever they run: the authenticated channels
(`wire`), the messages on them (`messages`, where other paths register theirs), the
payload (`payload`, `script`), the launch spec and command lines (`launch`), and
process helpers that let nothing outlive its job (`processes`).
"""
