import sys

from ._cli.main import program

if __name__ == "__main__":
    sys.exit(program())
