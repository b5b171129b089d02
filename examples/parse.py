def parse(text):
    if not text.isdigit():
        raise ValueError(text)
    return int(text)

for text in ["1", "x", "22"]:
    try:
        parse(text)
    except ValueError:
        pass
