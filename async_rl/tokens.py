"""Special tokens of sequence actions, shared by the environments that read a token sequence as
one action (CompilerGym pass lists) and the policies that write it (Passformer).

An action vocabulary starts with these four, in this order; the environment's own tokens follow.
"""
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
