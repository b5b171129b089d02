def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def squares(n):
    for i in range(n):
        yield i * i

print(fib(20), sum(squares(1000)))
