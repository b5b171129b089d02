import os

def key(word):
    os.write(2, b"")                  # a write(2) from Python called by C
    return word.lower()

def outer():
    return sorted(["b", "A", "c"], key=key)

outer()
