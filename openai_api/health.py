"""`GET /health`: open to all, for load balancers and start-up probes."""
from django.http import JsonResponse


async def health(request):
    return JsonResponse({"status": "ok"})
