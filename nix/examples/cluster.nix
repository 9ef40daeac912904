# On a Redis Cluster of three masters over TLS: every unit learns the slots
# from any node it is given, and follows resharding and failovers (see
# docs/deployment.md, "Redis Cluster"). The rendered ACL users file must be
# loaded on every node.
{
  redis = {
    createLocally = false;
    cluster = [ "rediss://10.0.0.1:6379" "rediss://10.0.0.2:6379" "rediss://10.0.0.3:6379" ];
    caFile = "/etc/cowboy/redis-ca.pem";
    waitReplicas = 1;
    username = "cowboy-admin";
    passwordFile = "/etc/cowboy/secrets/admin";
  };
  bridges.local = {
    type = "console";
    settings = { output = "/var/lib/cowboy/local.out"; input = "/var/lib/cowboy/local.in"; };
  };
}
