# One console bridge, no approval.
{
  bridges.local = {
    type = "console";
    settings = { output = "/var/lib/cowboy/local.out"; input = "/var/lib/cowboy/local.in"; };
  };
}
