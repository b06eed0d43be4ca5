"""One module per `pipesched` subcommand, each with add_parser(subparsers)."""
